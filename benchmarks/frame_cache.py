"""Reading training frames through the decode-once FrameCache vs decoding the videos every epoch.

Both paths deliver the same frames: every video sampled at 1 fps, resized to 240x135 with
INTER_AREA, RGB uint8, consumed in batches (the batch is converted to float32 and summed, a
stand-in for handing it to a model). "decode" runs `decode_video` on every video in every
epoch; "cache" fills a FrameCache once (timed separately) and then reads the memory-mapped
.npy files in every epoch. The two are timed alternately, epoch by epoch, in one process,
and the ratio of the median frames per second is printed.

By default the videos are synthetic ones written at Cholec80's 854x480 (decoding cost grows
with the source resolution; the cached frames are always 240x135). Pass a folder to use
your own videos (every *.mp4 below it).

    python benchmarks/frame_cache.py [--videos DIR] [--epochs 3] [--seconds 20] [--width 854 --height 480]

Note: after the first epoch the cache files sit in the OS page cache, as they would during
training when the cache fits in RAM (80 Cholec80 videos at 1 fps and 240x135 are ~18 GB);
when it does not, the cache path is bounded by the disk's read speed instead.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fedcare.data.surgical.synthetic import generate_surgical
from fedcare.data.video import DEFAULT_SIZE, FrameCache, decode_video

BATCH = 128


def consume(batch: np.ndarray) -> float:
    return float(batch.astype(np.float32).sum())


def decode_epoch(videos: list[Path]) -> tuple[int, float]:
    start = time.perf_counter()
    n = 0
    for path in videos:
        frames: list[np.ndarray] = []
        decode_video(path, frames.append, size=DEFAULT_SIZE, fps=1.0)
        for i in range(0, len(frames), BATCH):
            consume(np.stack(frames[i:i + BATCH]))
        n += len(frames)
    return n, time.perf_counter() - start


def cache_epoch(videos: list[Path], cache: FrameCache) -> tuple[int, float]:
    start = time.perf_counter()
    n = 0
    for path in videos:
        frames = cache.frames(path)
        for i in range(0, len(frames), BATCH):
            consume(np.asarray(frames[i:i + BATCH]))
        n += len(frames)
    return n, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=Path, help="folder with .mp4 files (default: generate synthetic ones)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=20, help="mean length of the generated Cholec80 videos")
    parser.add_argument("--width", type=int, default=854, help="width of the generated videos (Cholec80: 854)")
    parser.add_argument("--height", type=int, default=480, help="height of the generated videos (Cholec80: 480)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fedcare-bench-") as tmp:
        if args.videos is None:
            t = time.perf_counter()
            info = generate_surgical(Path(tmp) / "synth", videos=2, heichole_videos=4, seconds=args.seconds,
                                     width=args.width, height=args.height)
            elapsed = time.perf_counter() - t
            print(f"generated {info['videos']} synthetic videos ({info['frames']} frames at {args.width}x{args.height}) "
                  f"in {elapsed:.1f} s = {info['frames'] / elapsed:.0f} frames/s")
            root = Path(tmp) / "synth"
        else:
            root = args.videos
        videos = sorted(root.rglob("*.mp4"))
        if not videos:
            raise SystemExit(f"{root}: no .mp4 files")
        cache = FrameCache(Path(tmp) / "cache")
        t = time.perf_counter()
        for path in videos:
            cache.get(path)
        fill = time.perf_counter() - t
        stats = cache.stats()
        print(f"{len(videos)} videos; cache filled once in {fill:.2f} s ({stats.decoded_frames} frames, "
              f"{stats.bytes / 1e6:.1f} MB)")
        decode_fps, cache_fps = [], []
        for epoch in range(1, args.epochs + 1):
            n, t_decode = decode_epoch(videos)
            m, t_cache = cache_epoch(videos, cache)
            assert n == m, (n, m)
            decode_fps.append(n / t_decode)
            cache_fps.append(m / t_cache)
            print(f"epoch {epoch}: {n} frames; decode every epoch {n / t_decode:8.0f} frames/s, "
                  f"through the cache {m / t_cache:8.0f} frames/s")
        d, c = statistics.median(decode_fps), statistics.median(cache_fps)
        print(f"median: decode {d:.0f} frames/s, cache {c:.0f} frames/s, ratio cache/decode = {c / d:.1f}x")
        # what one decode-once pass costs against the epochs it saves
        print(f"the one-off fill ({fill:.2f} s) pays for itself after {fill / (n / d - m / c):.2f} epochs"
              if n / d > m / c else "the cache is not faster here")


if __name__ == "__main__":
    main()
