"""How a synthetic surgical video looks (`fedcare.data.surgical.synthetic`): the tissue scene,
the camera chain, the tools drawn along their episodes, smoke, and `render_video`, which writes
a planned video as an mp4 and returns what each frame shows (the labels come from the drawing)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.surgical.timeline import (BAG, CLIENT_CENTRE, CLIPPER, COAG, GRASPER, N_TOOLS, PROFILES, SCISSORS,
                                            STAPLER, SUCTION, VideoPlan, plan_rng)
from fedcare.data.video import decoder_id
from fedcare.errors import UserError


FOURCC = "mp4v"




class EncoderUnavailable(UserError, RuntimeError):
    """This machine's OpenCV cannot write the generator's mp4 files; the message names the codec."""

def _smooth_noise(shape: tuple[int, int], scale: float, rng: np.random.Generator) -> np.ndarray:
    h, w = shape
    small = rng.standard_normal((max(2, int(h / scale)) + 2, max(2, int(w / scale)) + 2)).astype(np.float32)
    big = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    return (big - big.mean()) / (big.std() + 1e-6)



class _Scene:
    """Everything of one video that does not depend on the tools."""

    def __init__(self, plan: VideoPlan, width: int, height: int, rng: np.random.Generator) -> None:
        self.w, self.h = width, height
        s = width / 240.0
        self.s = s
        tw, th = int(width * 1.5), int(height * 1.5)  # the camera moves over a larger texture
        gains, gamma, saturation = PROFILES[CLIENT_CENTRE[plan.client]]
        # drawn from `rng` in this order: tissue, highlights, optics
        noise = self._tissue(tw, th, saturation, rng)
        self._highlights(noise, tw, th, rng)
        self._optics(gains, gamma, tw, th, rng)
        smoke = np.zeros((int(60 * s), int(60 * s)), np.float32)
        cv2.circle(smoke, (smoke.shape[1] // 2, smoke.shape[0] // 2), int(18 * s), 1.0, -1)
        self.smoke = cv2.GaussianBlur(smoke, (0, 0), 9 * s)

    def _tissue(self, tw: int, th: int, saturation: float, rng: np.random.Generator) -> np.ndarray:
        """`texture`: red tissue with fat and vessels, in the camera's saturation; returns its
        relief (the noise that shaped it)."""
        s = self.s
        n = (0.55 * _smooth_noise((th, tw), 40 * s, rng) + 0.3 * _smooth_noise((th, tw), 12 * s, rng)
             + 0.15 * _smooth_noise((th, tw), 4 * s, rng))
        base = np.array([182, 78, 72], np.float32) * rng.uniform(0.92, 1.08, 3).astype(np.float32)
        tex = base[None, None, :] * (1.0 + 0.22 * n[..., None])
        fat = np.clip((_smooth_noise((th, tw), 30 * s, rng) - 1.0) * 1.2, 0, 0.85)
        fat = cv2.GaussianBlur(fat, (0, 0), 2.5 * s)[..., None]
        tex = tex * (1 - fat) + np.array([205, 170, 100], np.float32) * fat
        vessels = np.zeros((th, tw), np.float32)
        for _ in range(int(rng.integers(4, 9))):
            pts = [rng.uniform((0, 0), (tw, th))]
            direction = rng.uniform(0, 2 * math.pi)
            for _ in range(int(rng.integers(5, 12))):
                direction += rng.normal(0, 0.5)
                pts.append(pts[-1] + 14 * s * np.array([math.cos(direction), math.sin(direction)]))
            cv2.polylines(vessels, [np.round(np.array(pts)).astype(np.int32)], False, 1.0,
                          max(1, round(rng.uniform(1, 2.5) * s)), cv2.LINE_AA)
        vessels = cv2.GaussianBlur(vessels, (0, 0), 1.0 * s)[..., None]
        tex = tex * (1 - 0.55 * vessels) + np.array([110, 20, 28], np.float32) * 0.55 * vessels
        grey = tex.mean(axis=2, keepdims=True)
        tex = grey + (tex - grey) * saturation  # the camera's saturation, baked into the tissue
        self.texture = np.clip(tex, 0, 255).astype(np.uint8)
        return n

    def _highlights(self, n: np.ndarray, tw: int, th: int, rng: np.random.Generator) -> None:
        """`specular`: wet highlights, clusters of small glints on the bulging (bright) parts of the tissue."""
        s = self.s
        spec = np.zeros((th, tw), np.float32)
        bulge = n > np.quantile(n, 0.8)
        ys, xs = np.nonzero(bulge)
        for _ in range(int(rng.integers(5, 9))):
            i = int(rng.integers(len(xs)))
            cx, cy = xs[i], ys[i]
            angle = float(rng.uniform(0, 180))
            for _ in range(int(rng.integers(2, 6))):
                c = (int(cx + rng.normal(0, 6 * s)), int(cy + rng.normal(0, 4 * s)))
                axes = (max(1, int(rng.uniform(1.5, 5) * s)), max(1, int(rng.uniform(0.6, 1.6) * s)))
                cv2.ellipse(spec, c, axes, angle + float(rng.normal(0, 20)), 0, 360, float(rng.uniform(0.5, 1.0)), -1,
                            cv2.LINE_AA)
        spec = spec + 0.35 * cv2.GaussianBlur(spec, (0, 0), 4 * s)  # soft glow around the glints
        spec = np.clip(cv2.GaussianBlur(spec, (0, 0), 0.6 * s) * 255, 0, 255).astype(np.uint8)
        self.specular = np.repeat(spec[..., None], 3, axis=2)

    def _optics(self, gains, gamma: float, tw: int, th: int, rng: np.random.Generator) -> None:
        """The camera: `vignette`, its path over the texture (`cam`, `margin`), its colour
        response (`lut`), sensor noise and light flicker."""
        width, height = self.w, self.h
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        r = np.sqrt(((xx - width / 2) / (width / 2)) ** 2 + ((yy - height / 2) / (height / 2)) ** 2)
        strength = rng.uniform(0.35, 0.5)
        vignette = np.clip(1.0 - strength * r ** 2.2, 0.25, 1.0)
        self.vignette = np.repeat(np.round(vignette * 255)[..., None], 3, axis=2).astype(np.uint8)
        # camera path: slow sums of sinusoids, in texture pixels
        self.cam = [(rng.uniform(0.05, 0.25), rng.uniform(0, 2 * math.pi), rng.uniform(0.3, 1.0)) for _ in range(4)]
        self.margin = ((tw - width) / 2, (th - height) / 2)
        gains = np.array(gains) * rng.uniform(0.96, 1.04, 3)
        gamma = gamma * rng.uniform(0.95, 1.05)
        x = np.arange(256, dtype=np.float64) / 255.0
        lut = np.stack([np.clip(255.0 * (x ** gamma) * g, 0, 255) for g in gains], axis=-1).astype(np.uint8)
        self.lut = lut.reshape(1, 256, 3).copy()
        noise = [np.round(rng.normal(0, 3.0, (height, width, 3))).astype(np.int16) for _ in range(6)]
        self.noise_up = [np.clip(n, 0, 255).astype(np.uint8) for n in noise]
        self.noise_down = [np.clip(-n, 0, 255).astype(np.uint8) for n in noise]
        self.flicker = (rng.uniform(0.03, 0.06), rng.uniform(0.2, 0.5), rng.uniform(0, 2 * math.pi))

    def camera(self, t: float) -> tuple[float, float]:
        mx, my = self.margin
        dx = sum(a * math.sin(2 * math.pi * f * t / 10 + p) for a, p, f in self.cam[:2]) / 0.5
        dy = sum(a * math.sin(2 * math.pi * f * t / 10 + p) for a, p, f in self.cam[2:]) / 0.5
        return mx * (1 + 0.8 * math.tanh(dx)), my * (1 + 0.8 * math.tanh(dy))

    def background(self, t: float) -> np.ndarray:
        ox, oy = self.camera(t)
        ix, iy = int(ox), int(oy)
        frame = self.texture[iy:iy + self.h, ix:ix + self.w]
        sx = int(self.margin[0] + (ox - self.margin[0]) * 0.4)  # highlights slide against the tissue
        sy = int(self.margin[1] + (oy - self.margin[1]) * 0.4)
        a, f, p = self.flicker
        light = 1.0 + a * math.sin(2 * math.pi * f * t + p)
        frame = cv2.multiply(frame, self.vignette, scale=light / 255.0)
        return cv2.add(frame, self.specular[sy:sy + self.h, sx:sx + self.w])

    def finish(self, frame: np.ndarray, k: int) -> np.ndarray:
        i = k % len(self.noise_up)
        frame = cv2.subtract(cv2.add(frame, self.noise_up[i]), self.noise_down[i])
        return cv2.LUT(frame, self.lut)



@dataclass
class _Episode:
    t_on: float
    t_off: float
    kind: int  # coagulation: 0 hook, 1 bipolar
    port: np.ndarray
    centre: np.ndarray
    wobble: list = field(default_factory=list)  # (ax, ay, freq, phase)
    jaw: tuple[float, float] = (0.5, 0.0)

    RAMP = 0.35

    def depth(self, t: float) -> float:
        if t < self.t_on - self.RAMP or t > self.t_off + self.RAMP:
            return 0.0
        if t < self.t_on:
            x = (t - self.t_on + self.RAMP) / self.RAMP
        elif t > self.t_off:
            x = 1.0 - (t - self.t_off) / self.RAMP
        else:
            return 1.0
        return x * x * (3 - 2 * x)

    def tip(self, t: float) -> np.ndarray:
        target = self.centre + sum(np.array([ax * math.sin(f * t + p), ay * math.cos(0.7 * f * t + p)])
                                   for ax, ay, f, p in self.wobble)
        return self.port + self.depth(t) * (target - self.port)



# port sides per tool: (left, right, top) weights
PORT_SIDES = {GRASPER: (0.6, 0.1, 0.3), CLIPPER: (0.1, 0.7, 0.2), COAG: (0.1, 0.7, 0.2), SCISSORS: (0.15, 0.65, 0.2),
              SUCTION: (0.45, 0.45, 0.1), BAG: (0.5, 0.2, 0.3), STAPLER: (0.2, 0.6, 0.2)}



def _episodes(plan: VideoPlan, tool: int, runs: list[tuple[int, int]], active: tuple[float, float, float, float],
              rng: np.random.Generator, s: float) -> list[_Episode]:
    x0, y0, x1, y1 = active
    w, h = x1 - x0, y1 - y0
    side = int(rng.choice(3, p=np.array(PORT_SIDES[tool]) / sum(PORT_SIDES[tool])))
    out = []
    for a, b in runs:
        t_on = a - rng.uniform(0.0, 0.4)
        t_off = b - 1 + rng.uniform(0.3, 0.5)
        if side == 0:
            port = np.array([x0 - 0.35 * w, rng.uniform(y0 + 0.1 * h, y1 - 0.1 * h)])
        elif side == 1:
            port = np.array([x1 + 0.35 * w, rng.uniform(y0 + 0.1 * h, y1 - 0.1 * h)])
        else:
            port = np.array([rng.uniform(x0 + 0.15 * w, x1 - 0.15 * w), y0 - 0.45 * h])
        margin = 0.2 if tool != BAG else 0.28
        centre = np.array([rng.uniform(x0 + margin * w, x1 - margin * w), rng.uniform(y0 + margin * h, y1 - margin * h)])
        wobble = [(rng.uniform(0.02, 0.07) * w, rng.uniform(0.02, 0.07) * h, rng.uniform(0.8, 2.5),
                   rng.uniform(0, 2 * math.pi)) for _ in range(2)]
        kind = int(plan.coag_kind[a]) if tool == COAG else 0
        out.append(_Episode(t_on, t_off, kind, port, centre, wobble, (rng.uniform(0.3, 0.6), rng.uniform(0, 6.28))))
    return out



def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    runs, start = [], None
    for s, on in enumerate(mask):
        if on and start is None:
            start = s
        elif not on and start is not None:
            runs.append((start, s))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs



def _pt(p: np.ndarray) -> tuple[int, int]:
    return round(p[0] * 16), round(p[1] * 16)  # 4 fractional bits (cv2 shift=4)



def _line(img, a, b, colour, thickness):
    cv2.line(img, _pt(a), _pt(b), colour, max(1, round(thickness)), cv2.LINE_AA, 4)



def _shaft(img, port, joint, width_tip, colour, highlight):
    d = joint - port
    length = float(np.hypot(*d)) or 1.0
    u = d / length
    n = np.array([-u[1], u[0]])
    wp = width_tip * 2.2
    poly = np.array([port + n * wp / 2, joint + n * width_tip / 2, joint - n * width_tip / 2, port - n * wp / 2])
    cv2.fillConvexPoly(img, np.round(poly * 16).astype(np.int32), colour, cv2.LINE_AA, 4)
    _line(img, port + n * wp * 0.2, joint + n * width_tip * 0.2, highlight, max(1.0, width_tip * 0.25))
    return u, n



def _draw_grasper(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Grasper: two jaws opening and closing."""
    jl = 12 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 6 * s, (48, 48, 52), (110, 110, 118))
    opening = 0.15 + 0.3 * (0.5 + 0.5 * math.sin(2.0 * t + ep.jaw[1]))
    for sign in (1, -1):
        end = joint + jl * (u * math.cos(opening) + sign * n * math.sin(opening))
        _line(img, joint, end, (60, 60, 66), 4.2 * s)
        _line(img, joint, end, (165, 165, 175), 2.2 * s)



def _draw_clipper(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Clipper: two silver jaws holding a gold clip."""
    jl = 11 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 6.5 * s, (150, 150, 155), (215, 215, 220))
    for sign in (1, -1):
        _line(img, joint + sign * n * 3 * s, tip + sign * n * 3 * s, (190, 190, 198), 2.4 * s)
    clip = np.array([tip - u * 5 * s + n * 2.5 * s, tip + n * 2.5 * s, tip - n * 2.5 * s, tip - u * 5 * s - n * 2.5 * s])
    cv2.polylines(img, [np.round(clip * 16).astype(np.int32)], False, (235, 190, 50), max(1, round(2 * s)),
                  cv2.LINE_AA, 4)



def _draw_hook(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
               t: float, s: float) -> None:
    """Monopolar hook (one kind of Coagulation Instrument)."""
    joint = tip - u * 9 * s
    _shaft(img, port, joint, 4.5 * s, (22, 22, 24), (75, 75, 80))
    _line(img, joint, tip, (215, 215, 208), 3.2 * s)
    _line(img, tip, tip + n * 5 * s, (200, 200, 205), 1.8 * s)



def _draw_bipolar(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Bipolar forceps (the other kind of Coagulation Instrument)."""
    jl = 10 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 5 * s, (62, 72, 150), (120, 130, 200))
    for sign in (1, -1):
        _line(img, joint + sign * n * 1.6 * s, tip + sign * n * 2.4 * s, (205, 205, 215), 1.4 * s)
        cv2.circle(img, _pt(tip + sign * n * 2.4 * s), max(1, round(1.2 * s)) * 16, (80, 110, 220), -1,
                   cv2.LINE_AA, 4)



def _draw_scissors(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                   t: float, s: float) -> None:
    """Scissors: two curved blades opening a little."""
    bl = 14 * s
    joint = tip - u * bl
    _shaft(img, port, joint, 5.5 * s, (40, 40, 44), (100, 100, 108))
    spread = 0.25 + 0.15 * math.sin(3.0 * t + ep.jaw[1])
    for sign in (1, -1):
        a = joint + sign * n * 2 * s
        b = tip - sign * n * bl * math.sin(spread) * 0.5
        mid = (a + b) / 2 + sign * n * 1.5 * s
        cv2.polylines(img, [np.round(np.array([a, mid, b]) * 16).astype(np.int32)], False, (215, 215, 228),
                      max(1, round(2.2 * s)), cv2.LINE_AA, 4)



def _draw_suction(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Suction-Irrigation: a pale tube with holes near its tip."""
    _shaft(img, port, tip, 5 * s, (200, 202, 196), (245, 245, 240))
    cv2.circle(img, _pt(tip), round(2.6 * s * 16), (205, 207, 200), -1, cv2.LINE_AA, 4)
    for k in (3.5, 6.5):
        cv2.circle(img, _pt(tip - u * k * s), max(1, round(0.9 * s * 16)), (50, 50, 50), -1, cv2.LINE_AA, 4)



def _draw_bag(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
              t: float, s: float) -> None:
    """Specimen Bag: a translucent wobbling sack on a string to its port."""
    centre = tip
    angles = np.linspace(0, 2 * math.pi, 18, endpoint=False)
    rng = np.random.default_rng(int(ep.jaw[1] * 1000))
    radius = (1 + 0.18 * rng.standard_normal(len(angles))) * (0.75 + 0.35 * (0.5 + 0.5 * math.sin(ep.jaw[1])))
    rx, ry = 20 * s, 14 * s
    pts = np.stack([centre[0] + rx * radius * np.cos(angles + 0.05 * t),
                    centre[1] + ry * radius * np.sin(angles + 0.05 * t)], axis=1)
    overlay = img.copy()
    poly = np.round(pts * 16).astype(np.int32)
    cv2.fillPoly(overlay, [poly], (226, 212, 190), cv2.LINE_AA, 4)
    cv2.addWeighted(overlay, 0.62, img, 0.38, 0, dst=img)
    cv2.polylines(img, [poly], True, (175, 160, 140), max(1, round(1.0 * s)), cv2.LINE_AA, 4)
    _line(img, centre - np.array([rx, 0]) * 0.2, port, (200, 195, 170), 1.0 * s)



def _draw_stapler(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                  t: float, s: float) -> None:
    """Stapler (HeiChole only): a wide jaw."""
    jl = 22 * s
    joint = tip - u * jl
    _shaft(img, port, joint, 9 * s, (55, 58, 62), (120, 120, 130))
    jaw = np.array([joint + n * 4 * s, tip + n * 4 * s, tip - n * 4 * s, joint - n * 4 * s])
    cv2.fillConvexPoly(img, np.round(jaw * 16).astype(np.int32), (75, 85, 115), cv2.LINE_AA, 4)
    _line(img, joint, tip, (140, 150, 180), 1.5 * s)



def _draw_coagulation(img: np.ndarray, tip: np.ndarray, port: np.ndarray, u: np.ndarray, n: np.ndarray, ep: _Episode,
                      t: float, s: float) -> None:
    """A hook or a bipolar forceps, by the episode's kind."""
    (_draw_hook if ep.kind == 0 else _draw_bipolar)(img, tip, port, u, n, ep, t, s)



_DRAW = {GRASPER: _draw_grasper, CLIPPER: _draw_clipper, COAG: _draw_coagulation, SCISSORS: _draw_scissors,
         SUCTION: _draw_suction, BAG: _draw_bag, STAPLER: _draw_stapler}



def _draw_tool(img: np.ndarray, tool: int, ep: _Episode, t: float, s: float) -> np.ndarray:
    """Draw `tool` at time `t` of its episode (scale `s`), from its port to its tip; returns the tip."""
    tip = ep.tip(t)
    port = ep.port
    d = tip - port
    u = d / (float(np.hypot(*d)) or 1.0)
    n = np.array([-u[1], u[0]])
    if tool in _DRAW:
        _DRAW[tool](img, tip, port, u, n, ep, t, s)
    return tip



def _inside(p: np.ndarray, rect: tuple[float, float, float, float], margin: float) -> bool:
    x0, y0, x1, y1 = rect
    return x0 + margin <= p[0] <= x1 - margin and y0 + margin <= p[1] <= y1 - margin



def _segment_visible(a: np.ndarray, b: np.ndarray, rect: tuple[float, float, float, float]) -> bool:
    """Liang-Barsky: does segment a-b cross the rectangle?"""
    x0, y0, x1, y1 = rect
    d = b - a
    t0, t1 = 0.0, 1.0
    for p, q in ((-d[0], a[0] - x0), (d[0], x1 - a[0]), (-d[1], a[1] - y0), (d[1], y1 - a[1])):
        if p == 0:
            if q < 0:
                return False
        else:
            r = q / p
            if p < 0:
                t0 = max(t0, r)
            else:
                t1 = min(t1, r)
            if t0 > t1:
                return False
    return True



def _border_px(plan: VideoPlan, t: float, width: int) -> int:
    fraction = plan.border_alt if plan.alt_start <= t < plan.alt_end else plan.border
    return round(fraction * width)



def _info_bar(frame: np.ndarray, t: float, s: float) -> int:
    h, w = frame.shape[:2]
    bar = max(6, round(0.075 * h))
    frame[h - bar:] = (8, 8, 8)
    clock = int(t) + 9 * 3600 + 41 * 60
    text = f"{clock // 3600:02d}:{clock // 60 % 60:02d}:{clock % 60:02d}"
    cv2.putText(frame, text, (int(4 * s), h - int(bar * 0.25)), cv2.FONT_HERSHEY_PLAIN, 0.6 * s * (bar / (0.075 * 136)),
                (245, 245, 245), 1, cv2.LINE_AA)
    cv2.rectangle(frame, (w - int(30 * s), h - bar + 2), (w - int(6 * s), h - 3), (240, 240, 240), -1)
    return bar



def render_video(plan: VideoPlan, path: Path, width: int, height: int, seed: int,
            tick: Callable[[int], None]) -> np.ndarray:
    """Write the video; returns per-frame labels (frames, 7) for HeiChole's rule plus a shaft
    column, and for Cholec80 (frames, 8): tip-visible per slot (hook and bipolar apart)."""
    rng = plan_rng(seed, plan, 2)
    scene = _Scene(plan, width, height, rng)
    s = scene.s
    bar = max(6, round(0.075 * height)) if plan.info_bar else 0
    widest = round(max(plan.border, plan.border_alt) * width)
    active = (float(widest), 0.0, float(width - widest), float(height - bar))
    tracks: list[tuple[int, list[_Episode]]] = []
    for tool in range(N_TOOLS):
        tracks.append((tool, _episodes(plan, tool, _runs(plan.presence[:, tool]), active, plan_rng(seed, plan, 20 + tool), s)))
    if plan.stapler_run is not None:
        tracks.append((STAPLER, _episodes(plan, STAPLER, [plan.stapler_run], active, plan_rng(seed, plan, 30), s)))
    order = [BAG, SUCTION, STAPLER, CLIPPER, SCISSORS, COAG, GRASPER]  # back to front
    tracks.sort(key=lambda tr: order.index(tr[0]))

    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter_fourcc(*FOURCC), float(plan.fps), (width, height))
    if not writer.isOpened():
        raise EncoderUnavailable(f"{path}: this OpenCV build cannot write '{FOURCC}' mp4 files "
                           f"({decoder_id()['backend']} backend)")
    n = plan.frames
    # per frame: tip visible (8: 6 slots with coag split into hook/bipolar at 6/7... see below)
    tip_seen = np.zeros((n, 8), bool)  # 0..5 slots (coag=hook), 6 stapler, 7 bipolar
    shaft_seen = np.zeros((n, 8), bool)
    try:
        for k in range(n):
            t = k / plan.fps
            white = any(start <= t < end for start, end in plan.white)
            frame = scene.background(t)
            b = _border_px(plan, t, width)
            rect = (float(b), 0.0, float(width - b), float(height - bar))
            smoke = None
            for tool, episodes in tracks:
                for ep in episodes:
                    if ep.depth(t) <= 0.0:
                        continue
                    tip = _draw_tool(frame, tool, ep, t, s)
                    slot = 7 if (tool == COAG and ep.kind == 1) else tool
                    tip_seen[k, slot] = _inside(tip, rect, 3 * s)
                    shaft_seen[k, slot] = _segment_visible(ep.port, tip, rect)
                    if tool == COAG and ep.kind == 0 and tip_seen[k, slot]:
                        smoke = tip
            if smoke is not None and math.sin(3.1 * t) > -0.2:
                _blend_smoke(frame, scene.smoke, smoke, 0.45 * (0.5 + 0.5 * math.sin(3.1 * t)))
            frame = scene.finish(frame, k)
            if b > 0:
                frame[:, :b] = 3
                frame[:, width - b:] = 3
            if white:
                frame[:] = 255
                tip_seen[k] = shaft_seen[k] = False
            if bar:
                _info_bar(frame, t, s)
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
            tick(1)
    finally:
        writer.release()
    return np.concatenate([tip_seen, shaft_seen], axis=1)



def _blend_smoke(frame: np.ndarray, sprite: np.ndarray, at: np.ndarray, strength: float) -> None:
    h, w = frame.shape[:2]
    sh, sw = sprite.shape
    x0, y0 = int(at[0]) - sw // 2, int(at[1]) - sh // 2 - sh // 4
    fx0, fy0, fx1, fy1 = max(0, x0), max(0, y0), min(w, x0 + sw), min(h, y0 + sh)
    if fx0 >= fx1 or fy0 >= fy1:
        return
    a = sprite[fy0 - y0:fy1 - y0, fx0 - x0:fx1 - x0, None] * strength
    roi = frame[fy0:fy1, fx0:fx1].astype(np.float32)
    frame[fy0:fy1, fx0:fx1] = (roi * (1 - a) + 225.0 * a).astype(np.uint8)
