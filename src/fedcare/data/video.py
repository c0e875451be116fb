"""Decode surgical videos once, at 1 fps, into an on-disk frame cache.

A video is decoded with OpenCV's FFmpeg backend, sampled (every ``round(native_fps / fps)``-th
frame, starting at frame 0, or an explicit list of frame indices), resized to
(width, height) = (240, 135) with ``INTER_AREA`` (the Markert thesis's input size) and stored
as one uncompressed ``.npy`` array, uint8, shape (frames, height, width, 3), **RGB** order.
``np.load(mmap_mode="r")`` maps it without reading it, so training reads frames from the page
cache instead of decoding the video again every epoch (``benchmarks/frame_cache.py``
measures the difference).

Cache key
---------
A cache entry is valid for exactly one combination of

* the source file: its resolved path, size in bytes and modification time (ns);
* the target frame size and the interpolation;
* the sampling: the target fps, or the explicit frame indices;
* the decoder: the OpenCV version, the backend name (``FFMPEG``) and the libavcodec version
  OpenCV was built with;
* the cache format version (``CACHE_FORMAT``).

These are hashed (SHA-256) into the file name ``<video stem>-<key>.npy``. Next to it,
``<video stem>-<key>.json`` holds what was learnt while decoding (native fps, the number of
frames in the video, the source resolution, the frame index of every cached frame, decode
time), so that a second pass over the same videos opens no video at all: frames *and* facts
come from the cache. Both files are written to a temporary name in the cache folder and moved
into place with ``os.replace`` (frames first, facts last: an entry without its ``.json`` is
a miss), each synced to disk before its rename, so an interrupted decode never leaves a
half-written entry that looks valid. The ``.json`` holds the SHA-256 of the frames; an entry
whose ``.npy`` cannot be mapped (e.g. truncated by a full disk) or whose frames do not match it
(e.g. zero-filled by a crash of the file system) is decoded again. Each entry is checked once
per ``FrameCache`` object, the first time it is read. Entries follow the umask.

Editing or replacing a video changes its size or mtime and therefore its key; the old entry
is left behind (``FrameCache.clear`` removes everything). A video that no longer exists
cannot be looked up: the cache does not serve frames for a file it cannot identify.

Default folder: ``$FEDCARE_CACHE`` if set, else ``~/.cache/fedcare/frames``; every
``FrameCache`` takes another one as an argument.

Errors
------
A video that cannot be opened (missing, corrupt, truncated mp4 without its index, unknown
codec), that yields no frame, or whose decoding stops well before the frame count its
container declares (more than 2% and more than 1 s short) raises ``VideoDecodeError``
(a ``DataError``) naming the file. FFmpeg's own console messages are silenced
(``OPENCV_FFMPEG_LOGLEVEL=-8`` unless the user set it) since the error says what happened.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from fedcare.data.common import DataError
from fedcare.files import process_alive, umask

__all__ = [
    "CACHE_FORMAT",
    "DEFAULT_FPS",
    "DEFAULT_SIZE",
    "CacheStats",
    "CachedVideo",
    "FrameCache",
    "VideoDecodeError",
    "VideoInfo",
    "decode_video",
    "decoder_id",
    "default_cache_dir",
]

CACHE_FORMAT = 1
DEFAULT_SIZE: tuple[int, int] = (240, 135)  # (width, height), Markert thesis §5.2
DEFAULT_FPS = 1.0
BACKEND = cv2.CAP_FFMPEG
# Decoding that ends this much before the container's declared frame count is an error.
SHORT_FRACTION = 0.02
SHORT_SECONDS = 1.0


class VideoDecodeError(DataError):
    """A video that cannot be opened or decoded; the message names the file."""


@dataclass(frozen=True)
class VideoInfo:
    """What decoding learnt about a video (stored next to its cached frames)."""

    source: Path  # resolved path of the video file
    native_fps: float  # the container's frame rate
    frame_count: int  # frames actually decoded from the video (all of them, not only the sampled)
    declared_frame_count: int  # what the container declares (0 if unknown)
    source_size: tuple[int, int]  # (width, height) of the decoded frames before resizing
    size: tuple[int, int]  # (width, height) of the cached frames
    step: int  # sampling step in native frames (0 for explicit indices)
    frame_indices: tuple[int, ...]  # native frame index of each cached frame
    key: str
    decode_seconds: float

    @property
    def frames(self) -> int:
        return len(self.frame_indices)

    @property
    def duration_seconds(self) -> float:
        return self.frame_count / self.native_fps if self.native_fps > 0 else 0.0


@dataclass(frozen=True)
class CachedVideo:
    frames: np.ndarray  # (n, H, W, 3) uint8 RGB, read-only memory map
    info: VideoInfo


@dataclass(frozen=True)
class CacheStats:
    root: Path
    hits: int  # lookups served from disk by this FrameCache
    misses: int  # lookups that decoded the video
    decoded_frames: int  # frames stored by the misses
    decode_seconds: float  # time spent decoding (misses only)
    files: int  # cached videos (.npy files) in the cache folder
    bytes: int  # bytes of all cache files (.npy and .json) in the folder

    def as_dict(self) -> dict:
        return {"root": str(self.root), "hits": self.hits, "misses": self.misses,
                "decoded_frames": self.decoded_frames, "decode_seconds": round(self.decode_seconds, 3),
                "files": self.files, "bytes": self.bytes}


def default_cache_dir() -> Path:
    """``$FEDCARE_CACHE`` or ``~/.cache/fedcare/frames``."""
    env = os.environ.get("FEDCARE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedcare" / "frames"


_DECODER: dict | None = None


def decoder_id() -> dict:
    """OpenCV version, backend name and the libavcodec version of this OpenCV build."""
    global _DECODER
    if _DECODER is None:
        avcodec = ""
        match = re.search(r"avcodec:\s*YES\s*\(([^)]*)\)", cv2.getBuildInformation())
        if match:
            avcodec = match.group(1).strip()
        _DECODER = {"opencv": cv2.__version__, "backend": cv2.videoio_registry.getBackendName(BACKEND),
                    "avcodec": avcodec}
    return dict(_DECODER)


_QUIET_LOCK = threading.Lock()
_quiet_users = 0
_quiet_previous: int | None = None


@contextmanager
def quiet_opencv() -> Iterator[None]:
    """Silence OpenCV's and FFmpeg's console messages while decoding (we report problems
    ourselves). Reference-counted: threads decoding at the same time restore the log level
    once, when the last one is done."""
    global _quiet_users, _quiet_previous
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # read by OpenCV at every open
    logging = getattr(getattr(cv2, "utils", None), "logging", None)
    if logging is None:  # pragma: no cover
        yield
        return
    with _QUIET_LOCK:
        if _quiet_users == 0:
            _quiet_previous = logging.getLogLevel()
            logging.setLogLevel(logging.LOG_LEVEL_SILENT)
        _quiet_users += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _quiet_users -= 1
            if _quiet_users == 0 and _quiet_previous is not None:
                logging.setLogLevel(_quiet_previous)


def _check_size(size: tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be (width, height), got {size!r}") from None
    if w < 1 or h < 1:
        raise ValueError(f"size must be positive (width, height), got {size!r}")
    return (w, h)


def _sampling(fps: float | None, indices: Sequence[int] | None) -> dict:
    if indices is not None:
        idx = [int(i) for i in indices]
        if any(i < 0 for i in idx) or any(b <= a for a, b in itertools.pairwise(idx)):
            raise ValueError("indices must be non-negative and strictly increasing")
        return {"indices": hashlib.sha256(np.asarray(idx, np.int64).tobytes()).hexdigest(), "count": len(idx)}
    if fps is None or not (fps > 0):
        raise ValueError(f"fps must be positive, got {fps!r}")
    return {"fps": float(fps)}


def _retrieve(cap: cv2.VideoCapture, path: Path, i: int, size: tuple[int, int] | None) -> tuple[np.ndarray, tuple[int, int]]:
    """The grabbed frame `i` as RGB uint8 (resized to `size` with INTER_AREA unless None), and its native size."""
    ok, frame = cap.retrieve()
    if not ok or frame is None:
        raise VideoDecodeError(f"{path}: cannot decode frame {i}")
    if frame.ndim == 2:
        frame = cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)
    source_size = (frame.shape[1], frame.shape[0])
    if size is not None and source_size != size:
        frame = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), source_size


def _check_decoded(path: Path, wanted: set[int] | None, taken: list[int], frame_count: int, declared: int,
                   native_fps: float) -> None:
    """VideoDecodeError naming the file when a requested frame is past the end, nothing was
    decoded, or decoding stopped well before the frame count the file declares."""
    if wanted is not None and len(taken) < len(wanted):
        missing = sorted(wanted.difference(taken))
        raise VideoDecodeError(f"{path}: frame {missing[0]} requested but the video has only {frame_count} frames")
    if frame_count == 0 or not taken:
        raise VideoDecodeError(f"{path}: no frame could be decoded (empty or corrupt video)")
    if wanted is None and declared > 0:
        short = declared - frame_count
        if short > SHORT_FRACTION * declared and short > SHORT_SECONDS * native_fps:
            raise VideoDecodeError(f"{path}: decoding stopped after {frame_count} of the {declared} frames the "
                                   f"file declares (truncated or corrupt video)")


def decode_video(
    path: Path | str,
    sink: Callable[[np.ndarray], None],
    *,
    size: tuple[int, int] | None = DEFAULT_SIZE,
    fps: float | None = DEFAULT_FPS,
    indices: Sequence[int] | None = None,
) -> dict:
    """Decode `path` and hand every sampled frame (RGB uint8, resized to `size` with
    INTER_AREA; `size=None` keeps the native size) to `sink`. Sampling: `indices` (native
    frame numbers) if given, else every ``max(1, round(native_fps / fps))``-th frame from
    frame 0. Returns the facts of ``VideoInfo`` (without key and source). Raises
    VideoDecodeError naming the file."""
    path = Path(path)
    size = _check_size(size)
    if not path.is_file():
        raise VideoDecodeError(f"{path}: video file not found" if not path.exists() else f"{path}: not a file")
    start = time.perf_counter()
    with quiet_opencv():
        cap = cv2.VideoCapture(os.fspath(path), BACKEND)
        try:
            if not cap.isOpened():
                raise VideoDecodeError(f"{path}: cannot open the video (corrupt or truncated file, or not a "
                                       f"format the {decoder_id()['backend']} backend of OpenCV can read)")
            native_fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
            declared = max(0, int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0))
            if not native_fps > 0:
                raise VideoDecodeError(f"{path}: the video declares no frame rate")
            wanted: set[int] | None = None
            last = -1
            step = 0
            if indices is not None:
                wanted = {int(i) for i in indices}
                last = max(wanted) if wanted else -1
            else:
                step = max(1, round(native_fps / float(fps)))
            taken: list[int] = []
            source_size = (0, 0)
            i = 0
            while True:
                if wanted is not None and i > last:
                    break
                if not cap.grab():
                    break
                if (i in wanted) if wanted is not None else (i % step == 0):
                    frame, source_size = _retrieve(cap, path, i, size)
                    sink(frame)
                    taken.append(i)
                i += 1
        finally:
            cap.release()
    frame_count = i
    _check_decoded(path, wanted, taken, frame_count, declared, native_fps)
    return {
        "native_fps": native_fps, "frame_count": frame_count, "declared_frame_count": declared,
        "source_size": list(source_size), "step": step, "frame_indices": taken,
        "decode_seconds": time.perf_counter() - start,
    }


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class FrameCache:
    """Decode-once frame cache (see the module docstring).

    >>> cache = FrameCache()                     # $FEDCARE_CACHE or ~/.cache/fedcare/frames
    >>> video = cache.get("videos/video01.mp4")   # decodes on the first call only
    >>> video.frames.shape, video.info.native_fps # (n, 135, 240, 3) uint8 RGB memmap, 25.0
    >>> cache.stats()                            # hits, misses, files, bytes on disk

    `size` is (width, height) of the cached frames (None = native size), `fps` the default
    sampling rate. Thread-safe: different videos can be decoded from several threads.
    """

    root: Path | str | None = None
    size: tuple[int, int] | None = DEFAULT_SIZE
    fps: float = DEFAULT_FPS
    _hits: int = field(default=0, init=False, repr=False)
    _misses: int = field(default=0, init=False, repr=False)
    _decoded_frames: int = field(default=0, init=False, repr=False)
    _decode_seconds: float = field(default=0.0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _verified: set = field(default_factory=set, init=False, repr=False)  # .npy files whose checksum matched

    def __post_init__(self) -> None:
        self.root = Path(self.root).expanduser() if self.root is not None else default_cache_dir()
        self.size = _check_size(self.size)
        _sampling(self.fps, None)

    # ------------------------------------------------------------------ keys and paths

    def key(self, video: Path | str, *, fps: float | None = None, indices: Sequence[int] | None = None) -> str:
        """The cache key of `video` with this cache's size and the given sampling. Raises
        VideoDecodeError if the video does not exist (it cannot be identified)."""
        path = Path(video)
        try:
            resolved = path.resolve(strict=True)
            st = resolved.stat()
        except OSError:
            raise VideoDecodeError(f"{path}: video file not found") from None
        ident = {
            "format": CACHE_FORMAT,
            "source": {"path": os.fspath(resolved), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns},
            "size": list(self.size) if self.size is not None else None,
            "interpolation": "INTER_AREA",
            "sampling": _sampling(self.fps if fps is None and indices is None else fps, indices),
            "decoder": decoder_id(),
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]

    def _paths(self, video: Path | str, key: str) -> tuple[Path, Path]:
        stem = _SAFE.sub("_", Path(video).stem)[:60] or "video"
        base = Path(self.root) / f"{stem}-{key}"
        return base.with_suffix(".npy"), base.with_suffix(".json")

    def contains(self, video: Path | str, *, fps: float | None = None, indices: Sequence[int] | None = None) -> bool:
        """Whether `video` is cached (without decoding it)."""
        try:
            key = self.key(video, fps=fps, indices=indices)
        except VideoDecodeError:
            return False
        npy, meta = self._paths(video, key)
        return npy.is_file() and meta.is_file()

    # ------------------------------------------------------------------ lookups

    def get(self, video: Path | str, *, fps: float | None = None, indices: Sequence[int] | None = None) -> CachedVideo:
        """The cached frames and facts of `video`, decoding it first if it is not cached.
        Sampling: `indices` (native frame numbers), else `fps` (default: the cache's)."""
        key = self.key(video, fps=fps, indices=indices)
        npy, meta = self._paths(video, key)
        cached = self._load(npy, meta)
        if cached is not None:
            with self._lock:
                self._hits += 1
            return cached
        return self._decode(video, key, npy, meta, fps=self.fps if fps is None and indices is None else fps,
                            indices=indices)

    def frames(self, video: Path | str, **sampling) -> np.ndarray:
        """Shortcut for ``get(video).frames``: (n, H, W, 3) uint8 RGB, read-only memory map."""
        return self.get(video, **sampling).frames

    def info(self, video: Path | str, **sampling) -> VideoInfo:
        return self.get(video, **sampling).info

    def _load(self, npy: Path, meta: Path) -> CachedVideo | None:
        if not (npy.is_file() and meta.is_file()):
            return None
        try:
            facts = json.loads(meta.read_text())
            frames = np.load(npy, mmap_mode="r", allow_pickle=False)
            if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[0] != len(facts["frame_indices"]):
                raise ValueError("shape does not match its facts")
            if npy not in self._verified:
                if _frames_sha256(frames) != facts["frames_sha256"]:
                    raise ValueError("frames do not match their checksum")
                with self._lock:
                    self._verified.add(npy)
            info = _info_from(facts)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # damaged entry (or one written before checksums): decode again, replaced atomically
        return CachedVideo(frames, info)

    def _decode(self, video: Path | str, key: str, npy: Path, meta: Path, *, fps: float | None,
                indices: Sequence[int] | None) -> CachedVideo:
        Path(self.root).mkdir(parents=True, exist_ok=True)
        _remove_dead_decodes(Path(self.root))
        raw_fd, raw_name = tempfile.mkstemp(prefix=f"{_decode_prefix(os.getpid())}", suffix=".raw", dir=self.root)
        npy_tmp = meta_tmp = None
        shape: list[tuple[int, ...]] = []
        checksum = hashlib.sha256()
        try:
            with os.fdopen(raw_fd, "wb") as raw:
                def sink(frame: np.ndarray) -> None:
                    if shape and frame.shape != shape[0]:
                        raise VideoDecodeError(f"{video}: frame size changes within the video "
                                               f"({shape[0][1]}x{shape[0][0]} then {frame.shape[1]}x{frame.shape[0]}); "
                                               f"give the cache a fixed size")
                    shape[:1] = [frame.shape]
                    data = np.ascontiguousarray(frame).tobytes()
                    checksum.update(data)
                    raw.write(data)

                facts = decode_video(video, sink, size=self.size, fps=fps, indices=indices)
            n = len(facts["frame_indices"])
            h, w, c = shape[0]
            fd, npy_tmp = tempfile.mkstemp(prefix=".entry-", suffix=".npy", dir=self.root)
            with os.fdopen(fd, "wb") as out, open(raw_name, "rb") as src:
                np.lib.format.write_array_header_1_0(
                    out, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False,
                          "shape": (n, h, w, c)})
                shutil.copyfileobj(src, out, length=1 << 22)
                out.flush()
                os.fsync(out.fileno())
            facts.update({"format": CACHE_FORMAT, "key": key, "source": os.fspath(Path(video).resolve()),
                          "size": [w, h], "decoder": decoder_id(), "created": time.time(),
                          "frames_sha256": checksum.hexdigest()})
            fd, meta_tmp = tempfile.mkstemp(prefix=".entry-", suffix=".json", dir=self.root)
            with os.fdopen(fd, "w") as out:
                json.dump(facts, out)
                out.flush()
                os.fsync(out.fileno())
            for name in (npy_tmp, meta_tmp):
                os.chmod(name, 0o666 & ~umask())  # mkstemp makes 0600 files: entries follow the umask
            os.replace(npy_tmp, npy)
            npy_tmp = None
            os.replace(meta_tmp, meta)
            meta_tmp = None
        finally:
            for name in (raw_name, npy_tmp, meta_tmp):
                if name is not None:
                    try:
                        os.unlink(name)
                    except OSError:
                        pass
        with self._lock:
            self._misses += 1
            self._decoded_frames += n
            self._decode_seconds += facts["decode_seconds"]
        frames = np.load(npy, mmap_mode="r", allow_pickle=False)
        with self._lock:
            self._verified.add(npy)  # written from the frames just hashed
        return CachedVideo(frames, _info_from(facts))

    # ------------------------------------------------------------------ bookkeeping

    def stats(self) -> CacheStats:
        files = size = 0
        root = Path(self.root)
        if root.is_dir():
            for entry in os.scandir(root):
                if entry.is_file() and not entry.name.startswith(".") and entry.name.endswith((".npy", ".json")):
                    size += entry.stat().st_size
                    files += entry.name.endswith(".npy")
        with self._lock:
            return CacheStats(root, self._hits, self._misses, self._decoded_frames, self._decode_seconds, files, size)

    def clear(self) -> int:
        """Delete every cache entry in the folder; returns the number of videos removed."""
        removed = 0
        root = Path(self.root)
        if not root.is_dir():
            return 0
        for entry in os.scandir(root):
            if entry.is_file() and entry.name.endswith((".npy", ".json", ".raw")):
                removed += entry.name.endswith(".npy") and not entry.name.startswith(".")
                os.unlink(entry.path)
        return removed


def _decode_host_prefix() -> str:
    return f".decode-{_SAFE.sub('_', socket.gethostname())}-"


def _decode_prefix(pid: int) -> str:
    """A decode's scratch file names its host and process, so a later decode can tell a
    SIGKILLed one's leftovers from a running one's (in a cache shared across machines too)."""
    return f"{_decode_host_prefix()}{pid}-"


def _remove_dead_decodes(root: Path) -> None:
    """Remove scratch files of decodes on this host whose process is gone."""
    host_prefix = _decode_host_prefix()
    for entry in root.glob(f"{glob.escape(host_prefix)}*.raw"):
        pid = entry.name[len(host_prefix):].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            entry.unlink(missing_ok=True)


def _frames_sha256(frames: np.ndarray) -> str:
    """SHA-256 of a cached array's bytes (frame by frame: a memory map is not read whole)."""
    checksum = hashlib.sha256()
    for frame in frames:
        checksum.update(np.ascontiguousarray(frame).tobytes())
    return checksum.hexdigest()


def _info_from(facts: dict) -> VideoInfo:
    return VideoInfo(
        source=Path(facts["source"]),
        native_fps=float(facts["native_fps"]),
        frame_count=int(facts["frame_count"]),
        declared_frame_count=int(facts["declared_frame_count"]),
        source_size=tuple(int(v) for v in facts["source_size"]),  # type: ignore[arg-type]
        size=tuple(int(v) for v in facts["size"]),  # type: ignore[arg-type]
        step=int(facts["step"]),
        frame_indices=tuple(int(v) for v in facts["frame_indices"]),
        key=str(facts["key"]),
        decode_seconds=float(facts["decode_seconds"]),
    )
