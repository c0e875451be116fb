"""Chest X-ray (COVID-19 radiography, one folder per class): the reader (`reader`), the
synthetic copy in its layout (`synthetic`) and the `fedcare data summary xray` / `synth xray`
commands (`commands`). Nothing is imported here, so listing the datasets costs nothing."""
