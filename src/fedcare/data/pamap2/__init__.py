"""PAMAP2 physical activity monitoring: the reader (`reader`), the synthetic copy in its layout
(`synthetic`) and the `fedcare data summary pamap2` / `synth pamap2` commands (`commands`).
Nothing is imported here, so listing the datasets costs nothing."""
