"""Synthetic CelebA: procedurally drawn identities in the real dataset's on-disk layout.

``generate_celeba(out)`` writes (reference/dataset-formats.md §2)::

    img_align_celeba/000001.jpg ...     178 wide x 218 high JPEG (quality 92), RGB faces
    identity_CelebA.txt                 "000001.jpg 17" (no header)
    list_attr_celeba.txt                count line, the 40 attribute names (trailing space),
                                        "000001.jpg -1  1 ..." with -1/1 values
    list_eval_partition.txt             "000001.jpg 0" (0 train, 1 valid, 2 test)
    fedcare-synthetic.json              marker: these are NOT real people

so ``fedcare.data.celeba.reader.load_celeba`` reads it unchanged.

Faces are drawn by the pain generator's face drawer (``synthetic/face.py``) at 218 x 218 and
cropped to the central 178 columns. Each identity is a face shape, skin, hair and eye colour
(``face.identity``) plus identity traits; each image is a new "photo": head pose (rotation,
scale, shift, yaw), lighting gradient, colour cast, gain, contrast, noise, blur and background
(``face.session_conditions``), and an expression (smile, open mouth, brow jitter).

Attributes are labels of what is drawn (no label noise). Those that change the picture:

* identity level: Male (short hair, squarer jaw, no lipstick/long hair; else long hair, thinner
  brows), Young (old: forehead lines, crow's feet, deeper nasolabial folds, eye bags more likely,
  grey hair possible), Black_Hair / Blond_Hair / Brown_Hair / Gray_Hair (hair and brow colour;
  none of the four = red hair), Bald (skin-coloured scalp, no hair colour), No_Beard / Goatee /
  Mustache (full beard, chin goatee, moustache, drawn in the hair colour), 5_o_Clock_Shadow
  (stubble shading), Bushy_Eyebrows (1.8x thicker, darker brows), Arched_Eyebrows (2x arch),
  Chubby (wider face, round jaw), Oval_Face (narrower, longer face, tapered jaw),
  Bags_Under_Eyes (dark crescents under the eyes), Narrow_Eyes, Big_Nose, Big_Lips,
  Pale_Skin (lighter skin), Receding_Hairline (higher hairline), Bangs (hair low on the forehead);
* image level: Eyeglasses (frames, tinted lenses, bridge and temples), Wearing_Hat (crown and
  brim over the hair), Smiling (AU12 + AU6: corners up, cheeks raised), Mouth_Slightly_Open
  (AU25: lips part, teeth), Wearing_Lipstick (red lips), Heavy_Makeup (with lipstick: deeper
  red), Rosy_Cheeks (red cheek blush), Blurry (strong Gaussian blur), High_Cheekbones (drawn as
  raised cheeks: it goes with smiling).

Drawn at random with no visual effect: Attractive, Double_Chin (more likely when chubby),
Pointy_Nose, Sideburns, Straight_Hair, Wavy_Hair, Wearing_Earrings, Wearing_Necklace,
Wearing_Necktie.

Prevalences are chosen so that every attribute filter of the Hess thesis's Table 4.1 finds
images in a few hundred identities (CelebA's own prevalences are lower for e.g. Gray_Hair or
Bald); see ``IDENTITY_RATES``. Eyeglasses, hats, rosy cheeks and lipstick are per image with a
per-identity propensity, so an identity's images can fall under different attribute filters,
as in CelebA.

Determinism: identity ``i`` draws from ``np.random.default_rng([seed, i, 11])`` (traits) and
``face.identity(i, seed)`` (shape), its k-th image from ``default_rng([seed, i, 1000 + k])``;
image counts, the identity-disjoint train/valid/test split and the file numbering from
``default_rng([seed, 0, 7])``. The same seed gives the same files; an identity's pictures do not
depend on how many identities are generated. Every random number is drawn whatever the
attribute values, so ``draw_face(..., overrides={"Eyeglasses": True})`` changes only what that
attribute changes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.celeba.reader import ATTRIBUTES
from fedcare.data.common import MAX_IDENTITIES, MAX_IMAGES_PER_IDENTITY, SYNTHETIC_MARKER
from fedcare.data.synthetic import face
from fedcare.data.synthetic.output import atomic_directory, check_output_dir
from fedcare.errors import InputError

__all__ = ["HEIGHT", "VISUAL_ATTRIBUTES", "WIDTH", "SynthFace", "draw_face", "generate_celeba", "identity_traits"]

GENERATOR = "fedcare.data.synthetic.celeba"  # the marker keeps the name from before the dataset packages (same bytes)
NOTE = "SYNTHETIC data, not CelebA: procedurally drawn faces of people who do not exist"
WIDTH, HEIGHT = 178, 218
_RENDER = 218  # faces are drawn on a 218 x 218 square, columns 20..197 kept
_LEFT = (_RENDER - WIDTH) // 2
JPEG_QUALITY = 92
_PROCESS_THRESHOLD = 500  # images; below this, worker processes cost more than they save
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)  # identities in train / valid / test of list_eval_partition.txt

VISUAL_ATTRIBUTES: tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips", "Big_Nose",
    "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Eyeglasses", "Goatee",
    "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache", "Narrow_Eyes",
    "No_Beard", "Oval_Face", "Pale_Skin", "Receding_Hairline", "Rosy_Cheeks", "Smiling", "Wearing_Hat",
    "Wearing_Lipstick", "Young",
)

# Probabilities of the identity-level draws (documented in the module docstring).
IDENTITY_RATES = {
    "male": 0.5, "young": 0.55, "grey_if_old": 0.5, "bald_old_male": 0.3, "bald_young_male": 0.05,
    "hair_female": (0.3, 0.3, 0.35, 0.05), "hair_male": (0.4, 0.4, 0.12, 0.08),  # black, brown, blond, red
    # male facial hair: none, goatee, moustache, beard, beard + moustache
    "facial_hair": (0.42, 0.16, 0.14, 0.14, 0.14),
    "chubby": 0.18, "oval": 0.37, "glasses_young": 0.2, "glasses_old": 0.4, "hat_lover": 0.15,
}

_HAIR_BGR = {"black": (28, 28, 34), "brown": (32, 55, 92), "blond": (80, 150, 200), "grey": (168, 168, 172),
             "red": (40, 75, 160)}


@dataclass(frozen=True)
class SynthFace:
    """One drawn picture: the 178x218 BGR image (as written to JPEG), its 40 attributes and
    the eye centres (x, y) in pixels of that image."""

    image: np.ndarray
    attributes: dict[str, bool]
    eyes: np.ndarray  # (2, 2): image-left eye, image-right eye


# --------------------------------------------------------------------------- attributes


def identity_traits(identity: int, seed: int) -> dict:
    """The identity-level attributes and per-image propensities of one synthetic person."""
    rng = np.random.default_rng([seed, identity, 11])
    u = rng.random(40)
    R = IDENTITY_RATES
    male = bool(u[0] < R["male"])
    young = bool(u[1] < R["young"])
    grey = (not young) and bool(u[2] < R["grey_if_old"])
    bald = male and bool(u[3] < (R["bald_young_male"] if young else R["bald_old_male"]))
    probs = np.cumsum(R["hair_male"] if male else R["hair_female"])
    colour = ("black", "brown", "blond", "red")[int(np.searchsorted(probs, u[4] * probs[-1], side="right"))]
    if grey:
        colour = "grey"
    fh = int(np.searchsorted(np.cumsum(R["facial_hair"]), u[5], side="right")) if male else 0
    fh = min(fh, 4)
    shape = "chubby" if u[8] < R["chubby"] else ("oval" if u[8] < R["chubby"] + R["oval"] else "normal")
    t = {
        "Male": male, "Young": young, "Bald": bald,
        "Gray_Hair": grey and not bald, "Black_Hair": colour == "black" and not bald,
        "Brown_Hair": colour == "brown" and not bald, "Blond_Hair": colour == "blond" and not bald,
        "Goatee": fh == 1, "Mustache": fh in (2, 4), "No_Beard": fh not in (1, 3, 4),
        "5_o_Clock_Shadow": male and fh == 0 and bool(u[6] < 0.3),
        "Bushy_Eyebrows": bool(u[7] < (0.4 if male else 0.2)),
        "Chubby": shape == "chubby", "Oval_Face": shape == "oval",
        "Bags_Under_Eyes": bool(u[9] < (0.2 if young else 0.5)),
        "Pale_Skin": bool(u[14] < 0.15), "Narrow_Eyes": bool(u[15] < 0.12),
        "Big_Nose": bool(u[16] < (0.35 if male else 0.15)), "Big_Lips": bool(u[17] < 0.25),
        "Arched_Eyebrows": bool(u[18] < (0.1 if male else 0.45)),
        "Receding_Hairline": male and not bald and bool(u[19] < (0.1 if young else 0.35)),
        "Bangs": (not bald) and bool(u[20] < (0.08 if male else 0.3)),
        "Pointy_Nose": bool(u[21] < 0.25), "Attractive": bool(u[22] < (0.6 if young else 0.3)),
        "Double_Chin": bool(u[23] < (0.6 if shape == "chubby" else 0.04)),
        "Sideburns": male and bool(u[24] < 0.1),
        "Wavy_Hair": bool(u[25] < (0.45 if not male else 0.2)),
        "Wearing_Earrings": (not male) and bool(u[27] < 0.35),
        "Wearing_Necklace": (not male) and bool(u[28] < 0.15),
        "Wearing_Necktie": male and bool(u[29] < 0.1),
    }
    t["Straight_Hair"] = (not t["Wavy_Hair"]) and bool(u[26] < 0.4)
    return {
        "attributes": t,
        "hair": colour,
        "rosy": bool(u[10] < (0.08 if male else 0.45)),
        "lipstick": (not male) and bool(u[11] < 0.7),
        "glasses": bool(u[12] < (R["glasses_young"] if young else R["glasses_old"])),
        "hat_rate": 0.5 if u[13] < R["hat_lover"] else 0.1,
        "smile_rate": 0.3 + 0.4 * float(u[30]),
        "hair_shade": 0.85 + 0.3 * float(u[31]),
        "hair_long": 0.15 + 0.2 * float(u[32]),
        "hair_vol": float(u[33]),
        "frame": (int(u[34] * 60), int(u[35] * 60), int(u[36] * 60)),  # glasses frame colour
    }


def _image_attributes(traits: dict, v: np.ndarray) -> dict[str, bool]:
    a = dict(traits["attributes"])
    a["Eyeglasses"] = bool(v[0] < (0.85 if traits["glasses"] else 0.03))
    a["Wearing_Hat"] = bool(v[1] < traits["hat_rate"])
    a["Smiling"] = bool(v[2] < traits["smile_rate"])
    a["Mouth_Slightly_Open"] = bool(v[3] < (0.65 if a["Smiling"] else 0.15))
    a["Rosy_Cheeks"] = bool(v[4] < (0.85 if traits["rosy"] else 0.03))
    a["Wearing_Lipstick"] = bool(v[5] < (0.9 if traits["lipstick"] else 0.0))
    a["Heavy_Makeup"] = a["Wearing_Lipstick"] and bool(v[6] < 0.6)
    a["Blurry"] = bool(v[7] < 0.04)
    a["High_Cheekbones"] = (a["Smiling"] and bool(v[8] < 0.7)) or bool(v[8] < 0.05)
    assert set(a) == set(ATTRIBUTES), sorted(set(ATTRIBUTES) ^ set(a))
    return a


# --------------------------------------------------------------------------- drawing


def _appearance(base: dict, a: Mapping[str, bool], traits: dict) -> dict:
    """The face drawer's identity dict for these attributes."""
    idn = dict(base)
    skin = np.array(base["skin"], float)
    if a["Pale_Skin"]:
        skin = np.clip(skin * 1.12 + 25, 0, 255)
    idn["skin"] = skin
    if a["Chubby"]:
        idn.update(fw=base["fw"] + 0.03, taper=0.03, jaw_n=2.9)
    elif a["Oval_Face"]:
        idn.update(fw=base["fw"] - 0.015, taper=0.24, jaw_n=2.0, chin=base["chin"] + 0.025)
    if a["Male"]:
        idn["taper"] = min(idn["taper"], 0.12)
        idn["hair_long"] = 0.0
        idn["hair_vol"] = 0.005 + 0.025 * traits["hair_vol"]
    else:
        idn["hair_long"] = traits["hair_long"]
        idn["hair_vol"] = 0.03 + 0.03 * traits["hair_vol"]
    if a["Gray_Hair"]:
        colour = "grey"
    elif a["Black_Hair"]:
        colour = "black"
    elif a["Blond_Hair"]:
        colour = "blond"
    elif a["Brown_Hair"]:
        colour = "brown"
    else:
        colour = "red"
    hair = np.clip(np.array(_HAIR_BGR[colour], float) * traits["hair_shade"], 0, 255)
    idn["beard"] = hair * 0.9 if not a["Bald"] else np.array(_HAIR_BGR["brown"], float)
    if a["Bald"]:
        hair = np.clip(skin * 0.97, 0, 255)
        idn["hair_long"], idn["hair_vol"] = 0.0, 0.0
    idn["hair"] = hair
    # brows darker than the hair (light hair would leave the eye region without contrast)
    brow = (np.array(_HAIR_BGR[colour], float) if not a["Bald"] else np.array(_HAIR_BGR["brown"], float)) * 0.42 + 12
    idn["brow"] = brow
    if a["Bushy_Eyebrows"]:
        idn["brow_th"] = base["brow_th"] * 1.8
        idn["brow"] = brow * 0.75
    if a["Arched_Eyebrows"]:
        idn["brow_arch"] = base["brow_arch"] * 2.0
    if a["Narrow_Eyes"]:
        idn["eye_h"] = base["eye_h"] * 0.72
    if a["Big_Nose"]:
        idn["nose_w"] = base["nose_w"] * 1.3
    if a["Big_Lips"]:
        idn["lip_up"], idn["lip_lo"] = base["lip_up"] * 1.35, base["lip_lo"] * 1.35
    if a["Receding_Hairline"]:
        idn["hairline"] = base["hairline"] + 0.05
    if a["Bangs"]:
        idn["hair_dip"] = 0.04
        idn["hairline"] = base["hairline"] + 0.02
    if a["Wearing_Lipstick"]:
        idn["lip"] = np.array([55.0, 40.0, 200.0]) if a["Heavy_Makeup"] else np.array([80.0, 70.0, 185.0])
    return idn


def _shapes(idn: dict) -> Callable[[np.ndarray, dict], dict]:
    """Beard, goatee, moustache, hat and forehead-line polygons in unposed image fractions."""

    def build(lm: np.ndarray, extra: dict) -> dict:
        F = lm.shape[0]
        ones = np.ones(F)
        cx = 0.5
        out_ = {}
        centre = np.array([cx, idn["eye_y"]])
        jaw = lm[:, 4:13]
        jaw_out = centre + (jaw - centre) * 1.05
        # a full beard: jaw and chin up to the mouth corners, under the lower lip (cheeks stay bare)
        mouth_y = (lm[:, 48, 1] + lm[:, 54, 1]) / 2
        ceiling = np.stack([np.stack([lm[:, 12, 0] - 0.01, lm[:, 12, 1] - 0.012], -1),
                            np.stack([lm[:, 54, 0] + 0.02, mouth_y + 0.004], -1),
                            np.stack([lm[:, 54, 0] + 0.004, mouth_y + 0.016], -1),
                            np.stack([lm[:, 57, 0], lm[:, 57, 1] + 0.01], -1),
                            np.stack([lm[:, 48, 0] - 0.004, mouth_y + 0.016], -1),
                            np.stack([lm[:, 48, 0] - 0.02, mouth_y + 0.004], -1),
                            np.stack([lm[:, 4, 0] + 0.01, lm[:, 4, 1] - 0.012], -1)], 1)
        out_["beard"] = np.concatenate([jaw_out, ceiling], 1)
        chin = centre + (lm[:, 6:11] - centre) * 1.05
        lo = lm[:, 57, 1] + 0.006
        out_["goatee"] = np.concatenate(
            [chin, np.stack([lm[:, 55, 0] - 0.004, lo], -1)[:, None], np.stack([lm[:, 59, 0] + 0.004, lo], -1)[:, None]], 1)
        ny = lm[:, 33, 1]
        top = lm[:, 48:55].copy()
        top[..., 1] -= 0.003
        left = np.stack([lm[:, 48, 0] - 0.014, lm[:, 48, 1] + 0.008], -1)[:, None]
        right = np.stack([lm[:, 54, 0] + 0.014, lm[:, 54, 1] + 0.008], -1)[:, None]
        ceiling = np.stack([np.stack([lm[:, 54, 0] + 0.004, ny + 0.012], -1),
                            np.stack([cx * ones, ny + 0.006], -1),
                            np.stack([lm[:, 48, 0] - 0.004, ny + 0.012], -1)], 1)
        out_["mustache"] = np.concatenate([left, top, right, ceiling], 1)
        H = idn["jaw_top"] - idn["forehead"]
        brim_y = idn["forehead"] + idn["hairline"] + 0.03
        crown = face.ellipse(cx * ones, idn["jaw_top"] * ones, (idn["fw"] + 0.03) * ones, (H + 0.045) * ones,
                             np.pi, 2 * np.pi, 17)
        crown[..., 1] = np.minimum(crown[..., 1], brim_y)
        out_["hat_crown"] = crown
        bw = idn["fw"] + 0.07
        out_["hat_brim"] = np.broadcast_to(np.array([[cx - bw, brim_y - 0.016], [cx + bw, brim_y - 0.016],
                                                     [cx + bw, brim_y + 0.012], [cx - bw, brim_y + 0.012]]),
                                           (F, 4, 2)).copy()
        brow_top = np.minimum(lm[:, 19, 1], lm[:, 24, 1]) - 0.035
        lines = []
        for i in range(3):
            y = brow_top - 0.022 * i
            xs = cx + np.linspace(-0.55, 0.55, 7) * idn["fw"]
            ys = y[:, None] + 0.01 * (np.linspace(-1, 1, 7) ** 2)[None]
            lines.append(np.stack([np.broadcast_to(xs, ys.shape), ys], -1))
        out_["forehead"] = np.stack(lines, 1)  # (F, 3, 7, 2)
        return out_

    return build


def _blend(img: np.ndarray, draw: Callable[[np.ndarray], None], alpha: float) -> None:
    overlay = img.copy()
    draw(overlay)
    cv2.addWeighted(overlay, alpha, img, 1.0 - alpha, 0.0, dst=img)


SOCKET_SHADE = 0.35  # eye sockets darkened by up to 35% (soft): photos have them, Haar needs them
BEARD_ALPHA = 0.75  # beards and goatees blend over the skin (a solid dark jaw hides the face from Haar)


def _shade_sockets(img: np.ndarray, lm_px: np.ndarray, strength: float) -> None:
    """Darken the eye sockets (and a little under the nose) with a soft mask, as the light from
    above does in a photograph; this is the contrast a Haar face detector keys on."""
    if strength <= 0:
        return
    er, el = lm_px[36:42].mean(0), lm_px[42:48].mean(0)
    dist = float(np.hypot(*(el - er)))
    x0, y0 = np.floor(np.minimum(er, el) - dist * 0.6).astype(int)
    x1, y1 = np.ceil(np.maximum(er, el) + dist * 0.6).astype(int)
    h, w = img.shape[:2]
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    mask = np.zeros((y1 - y0, x1 - x0), np.float32)
    angle = math.degrees(math.atan2(el[1] - er[1], el[0] - er[0]))
    for c in (er, el):
        centre = (int(round(c[0] - x0)), int(round(c[1] - y0 - 0.05 * dist)))
        cv2.ellipse(mask, centre, (int(0.32 * dist), int(0.2 * dist)), angle, 0, 360, 1.0, -1)
    mask = cv2.GaussianBlur(mask, (0, 0), 0.12 * dist)
    roi = img[y0:y1, x0:x1].astype(np.float32)
    roi *= (1.0 - strength * mask)[..., None]
    img[y0:y1, x0:x1] = np.clip(roi, 0, 255).astype(np.uint8)


def _decorator(idn: dict, a: Mapping[str, bool], frame_colour: tuple[int, int, int], size: int):
    AA, SH = cv2.LINE_AA, 4
    beard = tuple(float(c) for c in idn["beard"])
    skin = np.asarray(idn["skin"], float)
    dark = tuple(float(c) for c in skin * 0.55)
    red = (70.0, 60.0, 215.0)
    hat = tuple(float(c) for c in (np.array(frame_colour) * 2 + 40))
    old = not a["Young"]

    def decorate(img: np.ndarray, f: int, L: np.ndarray, P: dict, stage: str) -> None:
        if stage == "skin":
            _shade_sockets(img, L[f] / 16.0, SOCKET_SHADE)
            if old:
                _blend(img, lambda o: cv2.polylines(o, list(P["forehead"][f]), False, dark, 1, AA, SH), 0.35)
            if a["5_o_Clock_Shadow"]:
                _blend(img, lambda o: cv2.fillPoly(o, [P["beard"][f]], dark, AA, SH), 0.22)
            if not a["No_Beard"] and not a["Goatee"]:
                _blend(img, lambda o: cv2.fillPoly(o, [P["beard"][f]], beard, AA, SH), BEARD_ALPHA)
            if a["Goatee"]:
                _blend(img, lambda o: cv2.fillPoly(o, [P["goatee"][f]], beard, AA, SH), BEARD_ALPHA)
            if a["Rosy_Cheeks"]:
                ch = P["cheeks"][f]
                _blend(img, lambda o: cv2.fillPoly(o, [ch[:10], ch[10:]], red, AA, SH), 0.45)
            if a["Bags_Under_Eyes"]:
                _blend(img, lambda o: cv2.polylines(o, list(P["bags"][f]), False, dark, 3, AA, SH), 0.45)
            return
        if a["Mustache"]:
            cv2.fillPoly(img, [P["mustache"][f]], beard, AA, SH)
        if a["Eyeglasses"]:
            er, el = L[f, 36:42].mean(0), L[f, 42:48].mean(0)
            d = el - er
            dist = float(np.hypot(*d))
            angle = math.degrees(math.atan2(d[1], d[0]))
            axes = (int(round(0.3 * dist)), int(round(0.22 * dist)))
            centres = [tuple(int(round(v)) for v in c) for c in (er, el)]
            _blend(img, lambda o: [cv2.ellipse(o, c, axes, angle, 0, 360, (90.0, 70.0, 60.0), -1, AA, SH)
                                   for c in centres], 0.15)
            th = max(2, int(round(size / 90)))
            for c in centres:
                cv2.ellipse(img, c, axes, angle, 0, 360, frame_colour, th, AA, SH)
            u = d / max(dist, 1e-6)
            inner_r = np.round(er + u * 0.3 * dist).astype(np.int32)
            inner_l = np.round(el - u * 0.3 * dist).astype(np.int32)
            cv2.line(img, tuple(inner_r), tuple(inner_l), frame_colour, th, AA, SH)
            outer_r = np.round(er - u * 0.3 * dist).astype(np.int32)
            outer_l = np.round(el + u * 0.3 * dist).astype(np.int32)
            cv2.line(img, tuple(outer_r), tuple(np.round(L[f, 0]).astype(np.int32)), frame_colour, th, AA, SH)
            cv2.line(img, tuple(outer_l), tuple(np.round(L[f, 16]).astype(np.int32)), frame_colour, th, AA, SH)
        if a["Wearing_Hat"]:
            cv2.fillPoly(img, [P["hat_crown"][f]], hat, AA, SH)
            cv2.fillPoly(img, [P["hat_brim"][f]], tuple(c * 0.8 for c in hat), AA, SH)

    return decorate


def _draw(identity: int, k: int, seed: int, traits: dict, base: dict,
          overrides: Mapping[str, bool] | None = None) -> SynthFace:
    rng = np.random.default_rng([seed, identity, 1000 + k])
    v = rng.random(16)
    a = _image_attributes(traits, v)
    if overrides:
        unknown = sorted(set(overrides) - set(ATTRIBUTES))
        if unknown:
            raise InputError(f"unknown CelebA attribute(s) {unknown}")
        a.update({key: bool(val) for key, val in overrides.items()})
    sess = face.session_conditions(rng, _RENDER)
    # photos are better exposed than the pain videos (blur kept: it helps the detector)
    sess["gain"] = 0.85 + 0.25 * float(v[9])
    sess["contrast"] = 0.9 + 0.25 * float(v[13])
    jit = face.ar1(1, 10, 0.85, rng)
    au = np.zeros((1, 9), np.int64)
    if a["Smiling"]:
        au[0, 5] = 3 + int(v[10] * 2.99)  # AU12
        au[0, 1] = 2  # AU6
    elif a["High_Cheekbones"]:
        au[0, 1] = 2
    if a["Mouth_Slightly_Open"]:
        au[0, 6] = 2 + int(v[11] * 1.99)  # AU25
    au[0, 0] = 1 if v[12] < 0.15 else 0  # a slight frown now and then
    idn = _appearance(base, a, traits)
    lm, extra, st = face.face_geometry(idn, au, jit, sess, extra_shapes=_shapes(idn))
    if not a["Young"]:
        st["folds"] = np.maximum(st["folds"], 0.35)
        st["crows"] = np.maximum(st["crows"], 0.3)
    if a["Bags_Under_Eyes"]:
        st["bags"] = np.maximum(st["bags"], 0.4)
    decorate = _decorator(idn, a, traits["frame"], _RENDER)
    img = face.render_faces(idn, sess, lm, extra, st, _RENDER, jit[:, 9], rng, decorate=decorate)[0]
    if a["Blurry"]:
        img = cv2.GaussianBlur(img, (0, 0), 2.2)
    eyes = np.stack([lm[0, 36:42].mean(0), lm[0, 42:48].mean(0)]) * _RENDER - np.array([_LEFT, 0])
    return SynthFace(np.ascontiguousarray(img[:, _LEFT : _LEFT + WIDTH]), a, eyes)


def draw_face(identity: int, image: int = 0, seed: int = 0,
              overrides: Mapping[str, bool] | None = None) -> SynthFace:
    """Draw the `image`-th picture of synthetic person `identity` as ``generate_celeba`` does;
    `overrides` force attributes (e.g. ``{"Eyeglasses": True}``) without changing any other
    random draw, so two calls differ only by what those attributes draw."""
    traits = identity_traits(identity, seed)
    return _draw(identity, image, seed, traits, face.identity(identity, seed), overrides)


# --------------------------------------------------------------------------- writing


def _plan(seed: int, n_identities: int, per_identity: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """Image counts per identity, each identity's split, and each identity's file numbers."""
    rng = np.random.default_rng([seed, 0, 7])
    lo, hi = max(2, int(math.ceil(per_identity * 0.5))), max(2, int(per_identity * 1.5))
    counts = rng.integers(lo, hi + 1, size=n_identities)
    order = rng.permutation(n_identities)
    n_train = int(round(SPLIT_FRACTIONS[0] * n_identities))
    n_valid = int(round(SPLIT_FRACTIONS[1] * n_identities))
    split = np.empty(n_identities, np.int64)
    split[order[:n_train]] = 0
    split[order[n_train : n_train + n_valid]] = 1
    split[order[n_train + n_valid :]] = 2
    numbers: list[list[int]] = [[] for _ in range(n_identities)]
    next_number = 1
    for s in (0, 1, 2):  # contiguous blocks per split, images of a split shuffled, as in CelebA
        members = np.flatnonzero(split == s)
        owners = np.repeat(members, counts[members])
        for owner in owners[rng.permutation(len(owners))]:
            numbers[owner].append(next_number)
            next_number += 1
    return counts, split, numbers


def _encode(path: str, image: np.ndarray) -> None:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:  # pragma: no cover
        raise OSError(f"{path}: JPEG encoding failed")
    with open(path, "wb") as fh:
        fh.write(buf.tobytes())


def _person(job: tuple[int, list[int], int, str]) -> list[tuple[int, int, dict[str, bool]]]:
    """Draw and write every picture of one identity; (file number, identity, attributes) rows."""
    identity, file_numbers, seed, folder = job
    traits = identity_traits(identity, seed)
    base = face.identity(identity, seed)
    rows = []
    for k, number in enumerate(file_numbers):
        pic = _draw(identity, k, seed, traits, base)
        _encode(os.path.join(folder, f"{number:06d}.jpg"), pic.image)
        rows.append((number, identity, pic.attributes))
    return rows


def _draw_people(jobs: list[tuple], workers: int, total: int,
                 progress: Callable[[int, int], None] | None) -> list[tuple[int, int, dict[str, bool]]]:
    """Draw every person's pictures (`_person`); (file number, identity, attributes) of every
    picture, sorted."""
    rows: list[tuple[int, int, dict[str, bool]]] = []
    if progress is not None:
        progress(0, total)
    if workers > 1 and total >= _PROCESS_THRESHOLD:
        # the drawing is Python-bound: processes, not threads ("spawn": safe whatever the
        # parent process has loaded)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = pool.map(_person, jobs, chunksize=max(1, len(jobs) // (workers * 8)))
            for got in results:
                rows += got
                if progress is not None:
                    progress(len(rows), total)
    else:
        for job in jobs:
            rows += _person(job)
            if progress is not None:
                progress(len(rows), total)
    rows.sort()
    return rows


def _write_lists(folder: Path, rows: list[tuple[int, int, dict[str, bool]]], split_of: dict[int, int]) -> None:
    """CelebA's three text files: identities, attributes (+1/-1) and the official partition."""
    ident_lines = [f"{n:06d}.jpg {identity}\n" for n, identity, _ in rows]
    attr_lines = [f"{len(rows)}\n", " ".join(ATTRIBUTES) + " \n"]
    attr_lines += [f"{n:06d}.jpg" + "".join(f" {1 if a[name] else -1:2d}" for name in ATTRIBUTES) + "\n"
                   for n, _, a in rows]
    part_lines = [f"{n:06d}.jpg {split_of[identity]}\n" for n, identity, _ in rows]
    (folder / "identity_CelebA.txt").write_text("".join(ident_lines))
    (folder / "list_attr_celeba.txt").write_text("".join(attr_lines))
    (folder / "list_eval_partition.txt").write_text("".join(part_lines))


def generate_celeba(
    out: Path | str,
    *,
    seed: int = 0,
    identities: int = 300,
    images_per_identity: int = 20,
    overwrite: bool = False,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write a synthetic CelebA copy into `out` (see the module docstring) and return a summary
    {"root", "identities", "images", "splits", "attribute_counts"}.

    identities: number of people (ids 1..identities).
    images_per_identity: mean pictures per person; each person gets a count drawn uniformly from
        [ceil(0.5 m), floor(1.5 m)] (at least 2), so counts vary as in CelebA.
    workers: drawing processes (default: the number of CPUs, at most 4; copies under 500 images
        are drawn in this process).
    The copy is written into a temporary sibling folder and renamed into place; FileExistsError
    if `out` is not empty (unless `overwrite`); ValueError for a bad option."""
    out = Path(out)
    for name, value, least, most in (("seed", seed, 0, None), ("identities", identities, 1, MAX_IDENTITIES),
                                     ("images_per_identity", images_per_identity, 2, MAX_IMAGES_PER_IDENTITY)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least \
                or (most is not None and value > most):
            raise InputError(f"{name} must be an integer >= {least}" + (f" and <= {most}" if most else "")
                             + f", got {value!r}")
    seed, identities, images_per_identity = int(seed), int(identities), int(images_per_identity)
    check_output_dir(out, overwrite, GENERATOR)
    counts, split, numbers = _plan(seed, identities, images_per_identity)
    total = int(counts.sum())
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    with atomic_directory(out, overwrite, GENERATOR) as tmp:
        folder = tmp / "img_align_celeba"
        folder.mkdir()

        jobs = [(i + 1, numbers[i], seed, str(folder)) for i in range(identities)]
        rows = _draw_people(jobs, workers, total, progress)
        _write_lists(tmp, rows, {identity: int(split[identity - 1]) for identity in range(1, identities + 1)})
        options = {"identities": identities, "images_per_identity": images_per_identity, "width": WIDTH,
                   "height": HEIGHT, "jpeg_quality": JPEG_QUALITY}
        marker = {"generator": GENERATOR, "seed": seed, "options": options, "note": NOTE,
                  "visual_attributes": list(VISUAL_ATTRIBUTES)}
        (tmp / SYNTHETIC_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    attribute_counts = {name: sum(a[name] for _, _, a in rows) for name in ATTRIBUTES}
    return {
        "root": str(out),
        "identities": identities,
        "images": total,
        "splits": {name: int(sum(counts[split == s])) for s, name in enumerate(("train", "valid", "test"))},
        "attribute_counts": attribute_counts,
    }
