"""CelebA (aligned and cropped): the reader and face cropper (`reader`), the partition of
identities into clients (`identity_partition`), the federation of cropped faces the facerec
study uses (`federation`), the synthetic copy (`synthetic`) and the `fedcare data summary
celeba` / `synth celeba` commands (`commands`). Nothing is imported here, so listing the
datasets costs nothing."""
