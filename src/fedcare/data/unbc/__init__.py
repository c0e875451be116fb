"""UNBC-McMaster Shoulder Pain: the reader (`reader`), the synthetic cohort in its layout
(`synthetic`) and the `fedcare data summary unbc` / `synth pain` commands (`commands`).
Nothing is imported here, so listing the datasets costs nothing."""
