"""The procedural face drawer shared by the synthetic generators (pain, CelebA).

A face is drawn from 66 landmarks (the AAM/iBUG layout) plus polygons for the head, hair, ears,
neck, shoulders, cheeks and wrinkles, all in image-fraction coordinates of a square image:

* ``identity(key, seed)``: who the face is (face shape, eye spacing, brows, skin, hair, iris
  colour, expressiveness), drawn from ``np.random.default_rng([seed, key, 1])``;
* ``session_conditions(rng, size)``: how it is photographed (head pose, lighting gradient, colour
  cast, gain, contrast, sensor noise, blur, background, clothes);
* ``face_geometry(idn, au, jit, sess)``: per-frame landmarks from the action-unit intensities
  ``au`` (F, 9) in the column order (AU4, AU6, AU7, AU9, AU10, AU12, AU25, AU26, AU43) and
  AR(1) jitter ``jit`` (F, 10), after the head pose;
* ``render_faces(...)``: BGR uint8 frames (F, size, size, 3).

The code came from the pain generator (``unbc/synthetic.py``, which imports it under its old
private names); the pain generator's files are byte-identical to before the move. Two optional
hooks let another generator add parts without touching the pain drawing:

* ``face_geometry(..., extra_shapes=fn)``: ``fn(lm, extra) -> dict`` of further (F, n, 2) point
  arrays, in the same unposed image-fraction coordinates; they are moved with the head pose like
  the built-in shapes and returned in ``extra``;
* ``render_faces(..., decorate=fn)``: ``fn(img, f, L, P, stage)`` draws on frame f at two
  stages: ``"skin"`` (after the face, hair cap and cheeks; before the features) and ``"top"``
  (after everything, before lighting, noise and blur). ``L`` are the landmarks and ``P`` the
  extra shapes of every frame in OpenCV's 4-bit fixed point (pixel * 16, shift 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace

import cv2
import numpy as np

__all__ = ["UNIT", "ar1", "colour", "ellipse", "face_geometry", "identity", "mix", "render_faces",
           "session_conditions"]

UNIT = 0.0042  # landmark displacement (fraction of the image) of an intensity-1 AU at gain 1


def ar1(length: int, dims: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-variance AR(1) noise, (length, dims): neighbouring frames are correlated."""
    z = rng.standard_normal((length, dims))
    out = np.empty_like(z)
    out[0] = z[0]
    c = math.sqrt(1 - rho * rho)
    for t in range(1, length):
        out[t] = rho * out[t - 1] + c * z[t]
    return out


# --------------------------------------------------------------------------------------
# Identity, session conditions and face geometry


def identity(subject: int, seed: int) -> dict:
    rng = np.random.default_rng([seed, subject, 1])
    U = rng.uniform
    eye_y = U(0.42, 0.46)
    tone = U(0.0, 1.0)  # 0 dark .. 1 light skin
    lum = 95 + 140 * tone
    skin = np.array([lum * U(0.62, 0.74), lum * U(0.76, 0.86), min(255.0, lum * U(0.98, 1.05))])
    hair_kind = rng.choice(4, p=[0.45, 0.3, 0.15, 0.1])  # black, brown, blond, grey
    hair = np.array([[28, 30, 34], [35, 55, 85], [90, 150, 185], [150, 150, 155]], dtype=float)[hair_kind]
    hair = np.clip(hair * U(0.8, 1.2), 0, 255)
    nose_y = eye_y + U(0.13, 0.16)
    mouth_y = nose_y + U(0.072, 0.09)
    return {
        "fw": U(0.25, 0.30), "eye_y": eye_y, "jaw_top": eye_y + U(0.0, 0.035),
        "chin": max(eye_y + U(0.36, 0.41), mouth_y + 0.1), "jaw_n": U(2.0, 2.9), "taper": U(0.05, 0.25),
        "forehead": eye_y - U(0.27, 0.31),
        "eye_dx": U(0.100, 0.122), "eye_w": U(0.043, 0.054), "eye_h": U(0.017, 0.024),
        "brow_dy": U(0.05, 0.068), "brow_arch": U(0.006, 0.016), "brow_th": U(0.011, 0.018),
        "nose_y": nose_y, "nose_w": U(0.032, 0.045), "mouth_y": mouth_y, "mouth_w": U(0.068, 0.088),
        "lip_up": U(0.009, 0.014), "lip_lo": U(0.012, 0.019),
        "hairline": U(0.035, 0.09), "hair_dip": U(-0.01, 0.02), "hair_vol": U(0.008, 0.05),
        "hair_long": U(0.0, 0.3) if rng.random() < 0.35 else 0.0,
        "gain": U(0.75, 1.3), "asym": U(-0.004, 0.004),
        "skin": skin, "hair": hair, "brow": hair * 0.6 + skin * 0.1,
        "lip": np.clip(skin * np.array([0.72, 0.66, 0.95]), 0, 255),
        "iris": (np.array([U(20, 60), U(30, 70), U(35, 80)]) if rng.random() < 0.8  # brown / dark
                 else np.array([U(90, 130), U(80, 110), U(40, 70)])),  # blue-grey
        "pain_severity": U(0.8, 1.25),
    }


def session_conditions(rng: np.random.Generator, size: int) -> dict:
    U = rng.uniform
    phi = U(0, 2 * np.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1) - 0.5
    light = 1.0 + U(0.0, 0.5) * (xx * math.cos(phi) + yy * math.sin(phi)) - U(0.0, 0.35) * (xx**2 + yy**2)
    return {
        "scale": U(0.9, 1.07), "rot": U(-6, 6), "tx": U(-0.035, 0.035), "ty": U(-0.03, 0.035), "yaw": U(-0.5, 0.5),
        "light": light[..., None].astype(np.float32),
        "cast": np.array([U(0.88, 1.1), U(0.93, 1.07), U(0.88, 1.1)], dtype=np.float32),
        "gain": U(0.72, 1.18), "contrast": U(0.75, 1.15), "noise": U(1.5, 5.5),
        "blur": U(0.0, 0.7) * size / 64.0,
        "bg": np.clip(rng.uniform(50, 210) * rng.uniform(0.85, 1.15, size=3), 0, 255),
        "clothes": rng.uniform(30, 220, size=3),
    }


def ellipse(cx, cy, ax, ay, a0: float, a1: float, n: int) -> np.ndarray:
    """(F, n, 2) points on ellipses with per-frame centres/axes, angles a0..a1 (y down)."""
    t = np.linspace(a0, a1, n)
    cx, cy, ax, ay = (np.asarray(v, dtype=float).reshape(-1, 1) for v in (cx, cy, ax, ay))
    return np.stack([cx + ax * np.cos(t), cy + ay * np.sin(t)], axis=-1)


class _Expression(SimpleNamespace):
    """What a face's parts need of one sequence: the AU intensities `a*` (raw) and `f*` (the
    identity's gain, compressed), the per-frame jitter, yaw and the shapes already placed."""


def _expression(idn: dict, au: np.ndarray, jit: np.ndarray, sess: dict) -> _Expression:
    e = _Expression(F=au.shape[0], g=idn["gain"], u=UNIT, cx=0.5)
    k = au.astype(float)
    fk = e.g * k ** 1.4
    e.a4, e.a6, e.a7, e.a9, e.a10, e.a12, e.a25, e.a26, e.a43 = (k[:, i] for i in range(9))
    e.f4, e.f6, e.f7, e.f9, e.f10, e.f12, _, e.f26 = (fk[:, i] for i in range(8))
    e.closed = e.a43 > 0
    # jitter columns: brow, eye opening (log), mouth corners, gaze, rot, tx, ty, scale, yaw, flicker
    e.j_brow, e.j_eye, e.j_mouth, e.j_gaze = jit[:, 0] * 0.8 * e.u, jit[:, 1] * 0.07, jit[:, 2] * 0.7 * e.u, jit[:, 3] * 0.35
    e.yaw = sess["yaw"] + 0.12 * jit[:, 8]
    e.fdx = e.yaw[:, None] * 0.022  # internal features shift with yaw (cheap 3-D look)
    return e


def _jaw(lm: np.ndarray, idn: dict, e: _Expression) -> None:
    """Landmarks 0..16 (AU26 drops the chin)."""
    u, cx = e.u, e.cx
    phi = np.linspace(0, np.pi, 17)
    c, s = np.cos(phi), np.sin(phi)
    n = idn["jaw_n"]
    jx = cx - idn["fw"] * np.sign(c) * np.abs(c) ** (2 / n) * (1 - idn["taper"] * s**6)
    jy = idn["jaw_top"] + (idn["chin"] - idn["jaw_top"]) * np.abs(s) ** (2 / n)
    e.drop = 1.8 * u * e.f26
    lm[:, 0:17, 0] = jx + 0.3 * e.fdx * s
    lm[:, 0:17, 1] = jy + e.drop[:, None] * s**2


def _brows(lm: np.ndarray, idn: dict, e: _Expression) -> None:
    """Landmarks 17..21 (image left, outer->inner) and 22..26 (inner->outer)."""
    u, cx, fdx = e.u, e.cx, e.fdx
    ew, edx, ey = idn["eye_w"], idn["eye_dx"], idn["eye_y"]
    sidx = np.linspace(0, 1, 5)  # 0 outer, 1 inner
    bx = -(edx + 1.15 * ew) + sidx * 2.05 * ew  # offset from cx for the left-image brow
    by = ey - idn["brow_dy"] - idn["brow_arch"] * np.sin(np.pi * (0.15 + 0.75 * (1 - sidx)))
    inner_w = 0.35 + 0.65 * sidx
    down = (1.3 * u * e.f4)[:, None] * inner_w + (0.45 * u * e.f9)[:, None] * sidx + (0.35 * u * e.f6)[:, None] * (1 - sidx)
    inward = (0.9 * u * e.f4)[:, None] * inner_w
    brow_y = by + down + e.j_brow[:, None]
    lm[:, 17:22, 0] = cx + bx + inward + fdx
    lm[:, 17:22, 1] = brow_y + idn["asym"]
    lm[:, 22:27, 0] = cx - (bx + inward)[:, ::-1] + fdx
    lm[:, 22:27, 1] = brow_y[:, ::-1] - idn["asym"]


def _eyes(lm: np.ndarray, idn: dict, e: _Expression) -> None:
    """Landmarks 36..47 and `e.eyes`: per side the lids, the eye polygon and the iris.
    Lids are curves y = centre -/+ h * (1 - q^2)^0.8, q in [-1, 1]."""
    u, cx, closed = e.u, e.cx, e.closed
    ew, eh, edx, ey = idn["eye_w"], idn["eye_h"], idn["eye_dx"], idn["eye_y"]
    h_lo_f = 1 - np.minimum(0.85, 0.085 * e.f6 + 0.11 * e.f7)
    h_up_f = (1 - np.minimum(0.5, 0.02 * e.f6 + 0.05 * e.f7)) * np.exp(e.j_eye)
    h_up = np.where(closed, 0.05 * eh, 1.05 * eh * h_up_f)
    h_lo = np.where(closed, 0.05 * eh, 0.85 * eh * h_lo_f)
    ecy = ey - (0.5 * u * e.f6 + 0.6 * u * e.f7) * 0.5 + np.where(closed, 0.35 * eh, 0.0)
    eyes = {}
    for side, sign in (("r", -1), ("l", 1)):
        ex = cx + sign * edx + e.fdx[:, 0]
        q = np.linspace(-1, 1, 9)
        shape = (1 - q**2) ** 0.8
        xs = ex[:, None] + q * ew
        upper = ecy[:, None] - h_up[:, None] * shape
        lower = ecy[:, None] + h_lo[:, None] * shape
        eyes[side] = (ex, xs, upper, lower)
        # iris clipped to the lids (analytically, so it works for all frames at once)
        ang = np.linspace(0, 2 * np.pi, 14, endpoint=False)
        r = 0.95 * eh
        ix = ex[:, None] + e.j_gaze[:, None] * ew * 0.5 + r * np.cos(ang)
        iy = (ecy - 0.1 * eh)[:, None] + r * np.sin(ang)
        qi = np.clip((ix - ex[:, None]) / ew, -0.97, 0.97)
        sh = (1 - qi**2) ** 0.8
        iy = np.clip(iy, ecy[:, None] - h_up[:, None] * sh, ecy[:, None] + h_lo[:, None] * sh)
        ix = ex[:, None] + qi * ew
        eyes[side + "_iris"] = np.stack([ix, iy], -1)
        eyes[side + "_poly"] = np.concatenate(
            [np.stack([xs, upper], -1), np.stack([xs[:, ::-1], lower[:, ::-1]], -1)[:, 1:-1]], axis=1
        )
    # landmark order per eye: outer corner, upper x2, inner corner, lower x2 (clockwise)
    ex_r, xs_r, up_r, lo_r = eyes["r"]
    ex_l, xs_l, up_l, lo_l = eyes["l"]
    # right (image left) eye: 36 outer(q=-1), 37 (q=-.35), 38 (q=.35), 39 inner(q=1), 40, 41
    qi_sel = [0, 3, 5, 8]  # indices into q = linspace(-1, 1, 9): -1, -0.25, 0.25, 1
    lm[:, 36:40, 0], lm[:, 36:40, 1] = xs_r[:, qi_sel], up_r[:, qi_sel]
    lm[:, 40, :] = np.stack([xs_r[:, 5], lo_r[:, 5]], -1)
    lm[:, 41, :] = np.stack([xs_r[:, 3], lo_r[:, 3]], -1)
    # left eye: 42 inner (q=-1), 43, 44 upper, 45 outer (q=1), 46, 47 lower
    lm[:, 42:46, 0], lm[:, 42:46, 1] = xs_l[:, qi_sel], up_l[:, qi_sel]
    lm[:, 46, :] = np.stack([xs_l[:, 5], lo_l[:, 5]], -1)
    lm[:, 47, :] = np.stack([xs_l[:, 3], lo_l[:, 3]], -1)
    e.eyes = eyes


def _nose(lm: np.ndarray, idn: dict, e: _Expression) -> None:
    """Landmarks 27..30 (bridge) and 31..35 (base; AU9 lifts and flares the wings, AU10 a little)."""
    u, cx, fdx = e.u, e.cx, e.fdx
    ny, nw, ey = idn["nose_y"], idn["nose_w"], idn["eye_y"]
    e.ndx = e.yaw[:, None] * 0.035
    lm[:, 27:31, 0] = cx + fdx + np.linspace(0, 1, 4) * (e.ndx - fdx)
    lm[:, 27:31, 1] = np.linspace(ey - 0.004, ny, 4)
    e.wing_up = 1.2 * u * e.f9 + 0.45 * u * e.f10
    base_x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0]) * nw
    base_y = ny + np.array([0.004, 0.016, 0.021, 0.016, 0.004])
    flare = (0.25 * u * e.f9)[:, None] * np.sign(base_x)
    lm[:, 31:36, 0] = cx + base_x + flare + e.ndx
    lm[:, 31:36, 1] = base_y - (e.wing_up[:, None] * np.array([1, 0.8, 0.45, 0.8, 1]))


def _mouth(lm: np.ndarray, idn: dict, e: _Expression) -> None:
    """Landmarks 48..59 (outer lip) and 60..65 (inner lip); `e.gap` is how far it opens."""
    u, cx, fdx, F = e.u, e.cx, e.fdx, e.F
    my, mw = idn["mouth_y"], idn["mouth_w"]
    corner_up = 1.6 * u * e.f12 + e.j_mouth + 0.2 * u * e.f10
    corner_out = 0.8 * u * e.f12
    lip_raise = 1.3 * u * e.f10  # AU10 lifts the upper lip, most at the centre
    gap = np.where(e.a25 > 0, 0.003 + 0.0035 * e.a25, 0.0) + 1.6 * u * e.f26 + np.where(e.a10 >= 3, 0.6 * u * e.f10, 0.0)
    lower_drop = gap * 0.75 + e.drop * 0.9
    upper_lift = gap * 0.25
    ox = np.array([-1, -0.62, -0.28, 0, 0.28, 0.62, 1, 0.6, 0.3, 0, -0.3, -0.6])
    oy_closed = np.array([0, -0.8, -1.1, -0.9, -1.1, -0.8, 0, 0.85, 1.0, 1.05, 1.0, 0.85])
    centre_w = 1 - np.abs(ox)  # 1 at the centre, 0 at the corners
    is_upper = np.array([0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], bool)
    is_lower = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1], bool)
    outer_x = cx + ox * mw + np.sign(ox) * corner_out[:, None] * np.abs(ox) ** 2 + fdx
    outer_y = my + np.where(is_upper, oy_closed * idn["lip_up"], oy_closed * idn["lip_lo"])[None, :].repeat(F, 0)
    outer_y = outer_y - corner_up[:, None] * (1 - centre_w) ** 2
    outer_y = outer_y - np.where(is_upper, (lip_raise + upper_lift)[:, None] * (0.5 + 0.5 * centre_w), 0.0)
    outer_y = outer_y + np.where(is_lower, lower_drop[:, None] * (0.4 + 0.6 * centre_w), 0.0)
    lm[:, 48:60, 0], lm[:, 48:60, 1] = outer_x, outer_y
    ix_ = np.array([-0.45, 0, 0.45, 0.45, 0, -0.45])
    iw = 1 - np.abs(ix_)
    inner_up = np.array([1, 1, 1, 0, 0, 0], bool)
    inner_x = cx + ix_ * mw + np.sign(ix_) * corner_out[:, None] * 0.4 + fdx
    inner_y = my - corner_up[:, None] * 0.3 + np.zeros(6)  # (F, 6)
    inner_y = inner_y + np.where(inner_up, -(upper_lift + 0.8 * lip_raise * (e.a10 >= 3))[:, None] * (0.5 + 0.5 * iw),
                                 lower_drop[:, None] * (0.4 + 0.6 * iw))
    lm[:, 60:66, 0], lm[:, 60:66, 1] = inner_x, inner_y
    e.gap = gap


def _head_shapes(lm: np.ndarray, idn: dict, e: _Expression) -> dict[str, np.ndarray]:
    """The outline, hair, ears, neck, shoulders and cheek highlights (raised by AU6, a little by AU12)."""
    u, cx, F = e.u, e.cx, e.F
    ey, edx = idn["eye_y"], idn["eye_dx"]
    H = idn["jaw_top"] - idn["forehead"]
    fw = idn["fw"]
    extra: dict[str, np.ndarray] = {}
    ones = np.ones(F)
    # face outline: jaw + forehead arc
    arc = ellipse(cx * ones, idn["jaw_top"] * ones, fw * ones, H * ones, np.pi * 1.0, np.pi * 2.0, 11)[:, 1:-1]
    extra["face"] = np.concatenate([lm[:, 0:17], arc[:, ::-1]], axis=1)
    hv = idn["hair_vol"]
    extra["hair_back"] = ellipse(cx * ones, (idn["forehead"] + 0.17 + idn["hair_long"] * 0.5) * ones,
                                  (fw + hv) * ones, (0.17 + hv + idn["hair_long"] * 0.5) * ones, 0, 2 * np.pi, 20)
    cap = ellipse(cx * ones, idn["jaw_top"] * ones, (fw + 0.012) * ones, (H + 0.012) * ones,
                   np.pi + 0.18, 2 * np.pi - 0.18, 13)
    hl = idn["forehead"] + idn["hairline"]
    line_x = cx + fw * np.array([0.93, 0.75, 0.35, 0.0, -0.35, -0.75, -0.93])
    line_y = hl + np.array([0.09, 0.035, idn["hair_dip"] * 0.5, idn["hair_dip"], idn["hair_dip"] * 0.5, 0.035, 0.09])
    extra["hair_cap"] = np.concatenate([cap, np.broadcast_to(np.stack([line_x, line_y], -1), (F, 7, 2))], axis=1)
    extra["ears"] = np.concatenate([
        ellipse((cx - fw + 0.005) * ones, (ey + 0.045) * ones, 0.028 * ones, 0.055 * ones, 0, 2 * np.pi, 10),
        ellipse((cx + fw - 0.005) * ones, (ey + 0.045) * ones, 0.028 * ones, 0.055 * ones, 0, 2 * np.pi, 10),
    ], axis=1)
    neck_top = idn["chin"] - 0.08
    neck = [[cx - 0.55 * fw, neck_top], [cx + 0.55 * fw, neck_top], [cx + 0.62 * fw, 1.1], [cx - 0.62 * fw, 1.1]]
    extra["neck"] = np.broadcast_to(np.array(neck), (F, 4, 2))
    extra["shoulders"] = ellipse(cx * ones, (idn["chin"] + 0.33) * ones, 0.55 * ones, 0.26 * ones,
                                  np.pi, 2 * np.pi, 13)
    cheek_up = 1.6 * u * e.f6 + 0.5 * u * e.f12 + 0.4 * u * e.f7
    cheeks = []
    for sign in (-1, 1):
        cheeks.append(ellipse(cx + sign * (edx + 0.01) + e.fdx[:, 0], ey + 0.075 - cheek_up,
                               0.045 * ones, 0.026 * ones, 0, 2 * np.pi, 10))
    extra["cheeks"] = np.concatenate(cheeks, axis=1)
    return extra


def _wrinkle_shapes(lm: np.ndarray, idn: dict, e: _Expression) -> dict[str, np.ndarray]:
    """Lower-lid bags, nasolabial folds, glabella furrows, nose-bridge wrinkles, crow's feet."""
    u, cx, fdx, ndx = e.u, e.cx, e.fdx, e.ndx
    ey, ny, nw, my, mw = idn["eye_y"], idn["nose_y"], idn["nose_w"], idn["mouth_y"], idn["mouth_w"]
    extra: dict[str, np.ndarray] = {}
    # lower-lid bags: a line under each eye that follows the lower lid
    bag = []
    for side in ("r", "l"):
        ex, xs, up, lo = e.eyes[side]
        bag.append(np.stack([xs[:, 1:8], lo[:, 1:8] + 0.011 * (1 - 0.25 * np.minimum(e.f6, 4))[:, None]], -1))
    extra["bags"] = np.stack(bag, 1)  # (F, 2, 7, 2)
    # nasolabial folds: nose wing -> past the mouth corner, pulled up by AU10/AU12/AU9
    fold_up = 1.0 * u * e.f10 + 1.0 * u * e.f12 + 0.5 * u * e.f9
    folds = []
    for sign in (-1, 1):
        p0 = np.stack([cx + sign * (nw + 0.01) + ndx[:, 0], ny - 0.004 - e.wing_up], -1)
        p1 = np.stack([cx + sign * (nw + 0.03) + fdx[:, 0], my - 0.02 - 0.5 * fold_up], -1)
        p2 = np.stack([cx + sign * (mw + 0.018) + fdx[:, 0], my + 0.03 - 0.7 * fold_up], -1)
        folds.append(np.stack([p0, p1, p2], 1))
    extra["folds"] = np.stack(folds, 1)  # (F, 2, 3, 2)
    # glabella furrows (AU4): two short vertical lines between the inner brows
    gl = []
    top = (lm[:, 21, 1] + lm[:, 22, 1]) / 2 - 0.004
    for sign in (-1, 1):
        x = cx + sign * 0.011 + fdx[:, 0]
        gl.append(np.stack([np.stack([x, top], -1), np.stack([x - sign * 0.002, top + 0.032], -1)], 1))
    extra["glabella"] = np.stack(gl, 1)  # (F, 2, 2, 2)
    # nose-bridge wrinkles (AU9): three short horizontal lines across the bridge
    nz = []
    for i, dy in enumerate((0.015, 0.027, 0.039)):
        y = ey + dy - 0.3 * u * e.f9
        half = nw * (0.45 + 0.1 * i)
        x0 = cx + fdx[:, 0] + (ndx[:, 0] - fdx[:, 0]) * (dy / (ny - ey))
        xs3, ys3 = (x0 - half, x0, x0 + half), (y + 0.002, y - 0.002, y + 0.002)  # a flat "^"
        nz.append(np.stack([np.stack([a, b], -1) for a, b in zip(xs3, ys3)], 1))
    extra["nose_wrinkles"] = np.stack(nz, 1)  # (F, 3, 3, 2)
    # crow's feet (AU6/AU7): three short lines fanning out from each outer eye corner
    cf = []
    for corner, sign in ((36, -1), (45, 1)):
        base = lm[:, corner]
        for dy in (-0.012, 0.0, 0.012):
            p0 = base + np.array([sign * 0.008, dy * 0.5])
            p1 = base + np.array([sign * 0.024, dy * 1.3])
            cf.append(np.stack([p0, p1], 1))
    extra["crows"] = np.stack(cf, 1)  # (F, 6, 2, 2)
    return extra


def _eye_shapes(e: _Expression) -> dict[str, np.ndarray]:
    """The eye polygons, irises, upper lids and lower lids, as drawn."""
    ex_r, xs_r, up_r, lo_r = e.eyes["r"]
    ex_l, xs_l, up_l, lo_l = e.eyes["l"]
    return {
        "eye_r": e.eyes["r_poly"], "eye_l": e.eyes["l_poly"], "iris_r": e.eyes["r_iris"], "iris_l": e.eyes["l_iris"],
        "lid_r": np.stack([xs_r, up_r], -1), "lid_l": np.stack([xs_l, up_l], -1),
        "lower_r": np.stack([xs_r, lo_r], -1), "lower_l": np.stack([xs_l, lo_l], -1),
    }


def _strength(e: _Expression) -> dict[str, np.ndarray]:
    """Wrinkle and fold darkness per frame: none added at intensity 1, clearly visible from
    2-3 on; and whether the teeth show and the mouth or the eyes are open or closed."""
    a4, a6, a7, a9, a10, a12, a25, a26, gap = e.a4, e.a6, e.a7, e.a9, e.a10, e.a12, e.a25, e.a26, e.gap
    return {
        "glabella": np.clip(0.16 * np.maximum(a4 - 1, 0), 0, 0.6) * min(e.g, 1.2),
        "nose_wrinkles": np.clip(0.16 * np.maximum(a9 - 1, 0), 0, 0.6),
        "crows": np.clip(0.13 * np.maximum(a6 - 1, 0) + 0.08 * np.maximum(a7 - 1, 0), 0, 0.6),
        "folds": np.clip(0.05 + 0.07 * np.maximum(a10 - 1, 0) + 0.05 * np.maximum(a12 - 1, 0)
                         + 0.03 * np.maximum(a9 - 1, 0), 0, 0.5),
        "bags": np.clip(0.07 + 0.06 * np.maximum(np.maximum(a6, a7) - 1, 0), 0, 0.45),
        "teeth": (gap > 0.009) & ((a10 >= 3) | (a25 >= 2) | (a26 >= 1)),
        "open": gap > 0.0025,
        "closed": e.closed,
    }


def _head_pose(lm: np.ndarray, extra: dict, jit: np.ndarray, sess: dict) -> tuple[np.ndarray, dict]:
    """Every point of every frame moved by the head pose (session + per-frame jitter): one
    similarity about the face centre."""
    F = lm.shape[0]
    pivot = np.array([0.5, 0.55])
    scale = sess["scale"] * (1 + 0.012 * jit[:, 7])
    rot = np.deg2rad(sess["rot"] + 1.3 * jit[:, 4])
    tx = sess["tx"] + 0.006 * jit[:, 5]
    ty = sess["ty"] + 0.006 * jit[:, 6]
    cr, sr = np.cos(rot) * scale, np.sin(rot) * scale
    M = np.stack([np.stack([cr, -sr], -1), np.stack([sr, cr], -1)], 1)  # (F, 2, 2)
    shift = pivot + np.stack([tx, ty], -1)
    parts = [lm] + list(extra.values())
    flat = np.concatenate([p.reshape(F, -1, 2) for p in parts], axis=1) - pivot
    moved = np.einsum("fij,fnj->fni", M, flat) + shift[:, None, :]
    out, start = [], 0
    for p in parts:
        n = p[0].size // 2
        out.append(moved[:, start : start + n].reshape(p.shape))
        start += n
    return out[0], dict(zip(extra.keys(), out[1:]))


def face_geometry(idn: dict, au: np.ndarray, jit: np.ndarray, sess: dict,
                  extra_shapes: Callable[[np.ndarray, dict], dict] | None = None) -> tuple[np.ndarray, dict, dict]:
    """Landmarks (F, 66, 2), extra drawing polylines and per-frame wrinkle strengths, all in
    image-fraction coordinates after the head pose."""
    e = _expression(idn, au, jit, sess)
    lm = np.zeros((e.F, 66, 2))
    for part in (_jaw, _brows, _eyes, _nose, _mouth):  # in this order: the mouth opens with the jaw
        part(lm, idn, e)
    extra = {**_head_shapes(lm, idn, e), **_wrinkle_shapes(lm, idn, e), **_eye_shapes(e)}
    strength = _strength(e)
    if extra_shapes is not None:
        extra.update(extra_shapes(lm, extra))
    lm, extra = _head_pose(lm, extra, jit, sess)
    return lm, extra, strength


# --------------------------------------------------------------------------------------
# Drawing


def mix(a: np.ndarray, b: np.ndarray, t: float) -> tuple[float, float, float]:
    """The colour a*(1-t) + b*t as an OpenCV colour tuple (blending over flat skin = alpha)."""
    c = a * (1 - t) + b * t
    return (float(c[0]), float(c[1]), float(c[2]))


def colour(a: np.ndarray) -> tuple[float, float, float]:
    return (float(a[0]), float(a[1]), float(a[2]))


def _palette(idn: dict, sess: dict, st: dict, k16: float) -> SimpleNamespace:
    """The colours of one identity in one session, the per-frame shade of each wrinkle, and the
    brows' half-thickness (in the 1/16-pixel units of the drawing)."""
    skin, hair, brow, lip = idn["skin"], idn["hair"], idn["brow"], idn["lip"]
    shadow = skin * 0.42
    c = SimpleNamespace(skin=colour(skin), ear=mix(skin, shadow, 0.12), neck=mix(skin, shadow, 0.22),
                        hair=colour(hair), brow=colour(brow), lip=colour(lip))
    c.cheek = mix(skin, np.minimum(skin * 1.12 + 8, 255), 0.35)
    c.sclera = mix(np.array([215.0, 222, 228]), skin, 0.35)
    c.iris = colour(idn["iris"])
    c.lash = mix(brow, np.zeros(3), 0.5)
    c.mouth = (35.0, 30.0, 45.0)
    c.teeth = (200.0, 215.0, 225.0)
    c.clothes = colour(sess["clothes"])
    shade = {key: (skin[None, :] * (1 - st[key][:, None]) + shadow[None, :] * st[key][:, None]).tolist()
             for key in ("bags", "folds", "nose_wrinkles", "glabella", "crows")}
    c.shade = {key: [tuple(v_) for v_ in v] for key, v in shade.items()}
    c.nose, c.nostril, c.lower = mix(skin, shadow, 0.12), mix(skin, shadow, 0.45), mix(skin, shadow, 0.35)
    c.lipline = mix(lip, np.zeros(3), 0.45)
    th = idn["brow_th"] * k16
    taper = np.array([0.55, 0.8, 1.0, 1.0, 0.9])
    c.brow_off = {17: np.stack([np.zeros(5), th * 0.5 * taper], -1),  # half-thickness per brow point
                  22: np.stack([np.zeros(5), th * 0.5 * taper[::-1]], -1)}
    return c


_AA, _SH = cv2.LINE_AA, 4  # anti-aliased, coordinates in 1/16 pixel


def _draw_head(img: np.ndarray, f: int, L: np.ndarray, P: dict, st: dict, c: SimpleNamespace) -> None:
    """The flat shapes: hair, shoulders, neck, ears, face, hair cap and cheeks."""
    AA, SH = _AA, _SH
    cv2.fillPoly(img, [P["hair_back"][f]], c.hair, AA, SH)
    cv2.fillPoly(img, [P["shoulders"][f]], c.clothes, AA, SH)
    cv2.fillPoly(img, [P["neck"][f]], c.neck, AA, SH)
    ears = P["ears"][f]
    cv2.fillPoly(img, [ears[:10], ears[10:]], c.ear, AA, SH)
    cv2.fillPoly(img, [P["face"][f]], c.skin, AA, SH)
    cv2.fillPoly(img, [P["hair_cap"][f]], c.hair, AA, SH)
    ch = P["cheeks"][f]
    cv2.fillPoly(img, [ch[:10], ch[10:]], c.cheek, AA, SH)


def _draw_skin_lines(img: np.ndarray, f: int, L: np.ndarray, P: dict, st: dict, c: SimpleNamespace) -> None:
    """Bags, folds and wrinkles, the nose's side shadow and nostrils, the brows."""
    AA, SH = _AA, _SH
    cv2.polylines(img, list(P["bags"][f]), False, c.shade["bags"][f], 1, AA, SH)
    cv2.polylines(img, list(P["folds"][f]), False, c.shade["folds"][f], 1, AA, SH)
    if st["nose_wrinkles"][f] > 0:
        cv2.polylines(img, list(P["nose_wrinkles"][f]), False, c.shade["nose_wrinkles"][f], 1, AA, SH)
    if st["glabella"][f] > 0:
        cv2.polylines(img, list(P["glabella"][f]), False, c.shade["glabella"][f], 1, AA, SH)
    cv2.polylines(img, [L[f, 27:31]], False, c.nose, 1, AA, SH)
    cv2.polylines(img, [L[f, 31:36]], False, c.nostril, 1, AA, SH)
    brows = []  # filled tapered polygons
    for i0, off in c.brow_off.items():
        b = L[f, i0 : i0 + 5]
        brows.append(np.round(np.concatenate([b - off, (b + off)[::-1]])).astype(np.int32))
    cv2.fillPoly(img, brows, c.brow, AA, SH)


def _draw_eyes_and_mouth(img: np.ndarray, f: int, L: np.ndarray, P: dict, st: dict, c: SimpleNamespace) -> None:
    """Eyes (or closed lids), crow's feet, lips, and an open mouth with its teeth."""
    AA, SH = _AA, _SH
    if st["closed"][f]:
        cv2.polylines(img, [P["lid_r"][f], P["lid_l"][f]], False, c.lash, 1, AA, SH)
    else:
        cv2.fillPoly(img, [P["eye_r"][f], P["eye_l"][f]], c.sclera, AA, SH)
        cv2.fillPoly(img, [P["iris_r"][f], P["iris_l"][f]], c.iris, AA, SH)
        cv2.polylines(img, [P["lid_r"][f], P["lid_l"][f]], False, c.lash, 1, AA, SH)
        cv2.polylines(img, [P["lower_r"][f], P["lower_l"][f]], False, c.lower, 1, AA, SH)
    if st["crows"][f] > 0:
        cv2.polylines(img, list(P["crows"][f]), False, c.shade["crows"][f], 1, AA, SH)
    cv2.fillPoly(img, [L[f, 48:60]], c.lip, AA, SH)
    if st["open"][f]:
        inner = np.concatenate([L[f, 48:49], L[f, 60:63], L[f, 54:55], L[f, 63:66]])
        cv2.fillPoly(img, [inner], c.mouth, AA, SH)
        if st["teeth"][f]:
            upper = L[f, 60:63].astype(np.float64)
            drop = (L[f, 64] - L[f, 61]) * 0.45
            tooth = np.concatenate([upper, (upper + drop)[::-1]])
            cv2.fillPoly(img, [np.round(tooth).astype(np.int32)], c.teeth, AA, SH)
    else:
        line = np.concatenate([L[f, 48:49], L[f, 60:63], L[f, 54:55]])
        cv2.polylines(img, [line], False, c.lipline, 1, AA, SH)


def _photometry(frames: np.ndarray, sess: dict, flicker: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """All frames at once: light gradient, colour cast, gain, contrast, sensor noise, blur."""
    x = frames.astype(np.float32)
    x *= sess["light"][None] * sess["cast"][None, None, None, :]
    x *= (sess["gain"] * (1 + 0.015 * flicker)).astype(np.float32)[:, None, None, None]
    x = (x - 128.0) * sess["contrast"] + 128.0
    # sensor noise: triangular (sum of two uniform bytes), sd = sess["noise"]; bytes are fast
    raw = np.frombuffer(rng.bytes(2 * x.size), np.uint8).reshape((2,) + x.shape)
    x += (raw[0].astype(np.float32) + raw[1] - 255.0) * np.float32(sess["noise"] / 104.1)
    out = np.clip(np.round(x), 0, 255).astype(np.uint8)
    if sess["blur"] > 0.25:
        for f in range(len(out)):
            out[f] = cv2.GaussianBlur(out[f], (0, 0), sess["blur"])
    return out


def render_faces(idn: dict, sess: dict, lm: np.ndarray, extra: dict, st: dict, size: int,
                 flicker: np.ndarray, rng: np.random.Generator,
                 decorate: Callable[..., None] | None = None) -> np.ndarray:
    """(F, size, size, 3) uint8 frames of the face `face_geometry` placed; `decorate(img, f, L,
    P, layer)` draws more on the skin ("skin") and over everything ("top")."""
    k16 = size * 16.0
    P = {k_: np.round(v * k16).astype(np.int32) for k_, v in extra.items()}
    L = np.round(lm * k16).astype(np.int32)
    c = _palette(idn, sess, st, k16)
    bg = np.empty((size, size, 3), np.uint8)
    bg[:] = np.clip(sess["bg"], 0, 255).astype(np.uint8)
    frames = np.empty((lm.shape[0], size, size, 3), np.uint8)
    for f in range(lm.shape[0]):
        img = bg.copy()
        _draw_head(img, f, L, P, st, c)
        if decorate is not None:
            decorate(img, f, L, P, "skin")
        _draw_skin_lines(img, f, L, P, st, c)
        _draw_eyes_and_mouth(img, f, L, P, st, c)
        if decorate is not None:
            decorate(img, f, L, P, "top")
        frames[f] = img
    return _photometry(frames, sess, flicker, rng)
