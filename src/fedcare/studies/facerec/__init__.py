"""The Hess face-verification study (federated ArcFace on CelebA, TAR@FAR before and after
tuning); see study.py and docs/architecture.md."""

from fedcare.studies.facerec.study import FacerecStudy

STUDY = FacerecStudy
