"""The Tobis thesis's fixed split of the UNBC-McMaster subjects ([code], thesis §3 "Subject
removal and groups"): subject 101 has no pain frames and is left out. The pain study's
defaults and the synthetic cohort's subjects both use it. Kept free of imports: the config
loader reads it."""

THESIS_GROUP1 = (42, 47, 49, 66, 95, 97, 103, 106, 108, 121, 123, 124)  # pretraining
THESIS_GROUP2 = (43, 48, 52, 59, 64, 80, 92, 96, 107, 109, 115, 120)  # training and evaluation
