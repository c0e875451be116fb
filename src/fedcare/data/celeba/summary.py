"""`summarize`: a CelebA copy (and its face crops, when detected) as a JSON-able overview
(`fedcare data summary celeba`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

import numpy as np


from fedcare.data.celeba.reader import ATTRIBUTES, CelebaDataset, PROBLEM_KINDS
from fedcare.data.celeba.faces import FaceSet


def summarize(ds: CelebaDataset, faces: FaceSet | None = None) -> dict:
    """JSON-able overview: counts, images per identity, attribute prevalences (% of images with
    the attribute = 1), partition counts, the detection rate (when `faces` is given), and every
    problem with its path (and line)."""
    per_identity = np.bincount(np.unique(ds.identities, return_inverse=True)[1]) if len(ds) else np.zeros(0, int)
    prevalence = {name: round(100.0 * float(ds.attributes[:, j].mean()), 2) if len(ds) else 0.0
                  for j, name in enumerate(ATTRIBUTES)}
    counts = Counter(p.kind for p in ds.problems)
    kinds = list(PROBLEM_KINDS)
    out = {
        "root": str(ds.root),
        "synthetic": ds.synthetic,
        "files": {k: (str(v) if v is not None else None) for k, v in asdict(ds.files).items()},
        "identities": int(len(per_identity)),
        "images": len(ds),
        "unlisted_images": ds.unlisted_images,
        "images_per_identity": ({"min": int(per_identity.min()), "mean": round(float(per_identity.mean()), 2),
                                 "max": int(per_identity.max())} if len(per_identity) else None),
        "partition": ({name: int((ds.partition == k).sum()) for k, name in enumerate(("train", "valid", "test"))}
                      if ds.partition is not None else None),
        "attribute_prevalence_percent": prevalence,
        "detection": None,
        "problem_counts": {k: counts[k] for k in sorted(counts, key=lambda k: kinds.index(k) if k in kinds else 99)},
        "problems": [{"kind": p.kind, "path": str(p.path), "line": p.line, "detail": p.detail} for p in ds.problems],
    }
    if faces is not None:
        looked = len(faces.rows) + len(faces.no_face) + len(faces.unreadable)
        out["detection"] = {
            "detector": faces.detector, "params": asdict(faces.params), "images": looked,
            "identities": len(faces._entries), "faces": len(faces.rows), "no_face": len(faces.no_face),
            "unreadable": len(faces.unreadable), "rate_percent": round(100.0 * faces.detection_rate, 2),
        }
    return out
