"""Laparoscopic videos for the surgical study: the Cholec80 and HeiChole layouts (`cholec80`,
`heichole`) read by one scanner and loader (`layout`), what both share (`common`: the 6 tools,
the video record, borders and white frames), the thesis's five clients (`clients`), the
synthetic videos in both layouts (`synthetic`) and the `fedcare data summary cholec80|heichole`
/ `synth surgical` commands (`commands`). Nothing is imported here, so listing the datasets
costs nothing."""
