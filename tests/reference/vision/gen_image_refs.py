#!/usr/bin/env python3
"""Reference data for crates/lone-core/src/vision/image.rs (decoder + LFM2-VL image processor).

Writes small test images and transformers 5.24's outputs for them into
tests/reference/vision/images/ (deterministic; a few seconds):

    python tests/reference/vision/gen_image_refs.py

Needs torch, torchvision, transformers 5.24, Pillow (with WebP), tokenizers, numpy. The
reference resize is torchvision's uint8 path, which torchvision takes on x86 CPUs with
AVX2/AVX-512 and on aarch64; run it on such a machine.

Files:
  *.png *.jpg *.gif *.webp   the test images (small; synthetic)
  exif6_64x48.jpg.pil.rgb    PIL's decoding of the JPEG (upright, RGB, HWC), for the JPEG
                             decoder's tolerance and the JPEG pipeline case
  refs.json                  everything else:
    decode         per image: PIL `load_image` (exif_transpose + convert("RGB")) size and
                   SHA-256 of its HWC bytes; the same for torchvision's `decode_image`
                   (transformers' `load_image_as_tensor`, used for paths/URLs) where it differs
    cases          the processor on one image and one config: rows, cols, image_sizes,
                   spatial_shapes, SHA-256 of each tile's unpadded pixel_values (f32 LE,
                   [h*w, 3*p*p]) and its first 16 values, the expanded text for "<image>"
                   run-length encoded ([token, count] pairs) and its <image> count
    normalize      `rescale_and_normalize` of the bytes 0..255 for several configs ([3][256])
    target_ratios  `_target_ratios(min, max)` for many (min, max)
    grid           `_get_grid_layout` results, including exact aspect-ratio ties
    sizes          `smart_resize` and `_is_image_too_large` over many sizes, two configs
    resize         torchvision `resize(uint8, BILINEAR, antialias=True)` of splitmix64 noise
    resize_bicubic the same resizes with BICUBIC
    qwen_sizes     Qwen2-VL's `smart_resize` (LFM3-VL's processor) over many sizes, three configs
                   (see `noise`): SHA-256 of the HWC output, and the bytes when small
"""

import hashlib
import io
import json
import math
import os
import re
import sys
import warnings

import numpy as np
import PIL.Image
import torch

warnings.filterwarnings("ignore")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from torchvision.transforms.v2 import functional as tvF  # noqa: E402
from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor, PreTrainedTokenizerFast  # noqa: E402
from transformers.image_utils import load_image, load_image_as_tensor  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "images")

SMALL = dict(
    min_image_tokens=4,
    max_image_tokens=16,
    tile_size=128,
    encoder_patch_size=16,
    downsample_factor=2,
    min_tiles=2,
    max_tiles=4,
)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def noise(h: int, w: int, seed: int) -> np.ndarray:
    """HWC uint8 RGB: byte i (row-major HWC) is the top byte of splitmix64(seed << 32 | i);
    odd seeds keep only 0 or 255 (saturating content)."""
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) << np.uint64(32)) + np.arange(h * w * 3, dtype=np.uint64)
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    b = (z >> np.uint64(56)).astype(np.uint8)
    if seed % 2 == 1:
        b = np.where(b >= 128, 255, 0).astype(np.uint8)
    return b.reshape(h, w, 3)


# --------------------------------------------------------------------------------------------
# Test images


def pattern(h, w, seed, noise_amp=0):
    """A compressible RGB pattern (sawtooth ramps) with optional noise (for the files)."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(3 * x + 5 * y) % 256, (7 * x + 2 * y + 40) % 256, (x * y // 7 + 100) % 256], -1)
    if noise_amp:
        rng = np.random.default_rng(seed)
        img = img + rng.integers(-noise_amp, noise_amp + 1, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def synthetic(h, w, seed):
    """The larger processor inputs, computed rather than stored (the Rust test computes the
    same): sawtooth ramps r = (3x + 5y) % 256, g = (7x + 2y + 40) % 256,
    b = (x·y // 7 + 100) % 256, plus `noise(h, w, seed) % 7 − 3`, clamped (seed even)."""
    assert seed % 2 == 0
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(3 * x + 5 * y) % 256, (7 * x + 2 * y + 40) % 256, (x * y // 7 + 100) % 256], -1)
    img = img + noise(h, w, seed).astype(np.int64) % 7 - 3
    return np.clip(img, 0, 255).astype(np.uint8)


def exif_bytes(orientation: int) -> bytes:
    e = PIL.Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def make_images():
    rng = np.random.default_rng(1234)
    files = {}

    def save(name, im, **kw):
        path = os.path.join(OUT, name)
        im.save(path, **kw)
        files[name] = path

    save("rgb_37x50.png", PIL.Image.fromarray(rng.integers(0, 256, (50, 37, 3), dtype=np.uint8)))
    save("rgba_33x21.png", PIL.Image.fromarray(rng.integers(0, 256, (21, 33, 4), dtype=np.uint8), "RGBA"))
    save("gray_45x33.png", PIL.Image.fromarray(rng.integers(0, 256, (33, 45), dtype=np.uint8), "L"))
    save("gray_alpha_20x14.png", PIL.Image.fromarray(rng.integers(0, 256, (14, 20, 2), dtype=np.uint8), "LA"))
    g16 = rng.integers(0, 65536, (12, 20), dtype=np.uint16)
    save("gray16_20x12.png", PIL.Image.fromarray(g16))
    rgb16 = rng.integers(0, 65536, (9, 11, 3), dtype=np.uint16)
    # Pillow cannot write 16-bit RGB; write it with a minimal PNG encoder.
    write_png16(os.path.join(OUT, "rgb16_11x9.png"), rgb16)
    files["rgb16_11x9.png"] = os.path.join(OUT, "rgb16_11x9.png")
    pal = PIL.Image.fromarray(rng.integers(0, 16, (29, 41), dtype=np.uint8), "P")
    palette = rng.integers(0, 256, 16 * 3, dtype=np.uint8).tolist()
    pal.putpalette(palette)
    save("palette_41x29.gif", pal, transparency=3)
    save("palette_trns_23x17.png", pal.crop((0, 0, 23, 17)), transparency=5)
    jpg = PIL.Image.fromarray(pattern(48, 64, 7, 20))
    save("exif6_64x48.jpg", jpg, quality=90, exif=exif_bytes(6))
    save("exif8_30x20.png", PIL.Image.fromarray(pattern(20, 30, 8, 30)), exif=exif_bytes(8))
    save("one_1x1.png", PIL.Image.fromarray(np.array([[[200, 30, 77]]], dtype=np.uint8)))
    save("lossless_33x21.webp", PIL.Image.fromarray(rng.integers(0, 256, (21, 33, 3), dtype=np.uint8)), lossless=True)
    save("lossy_40x30.webp", PIL.Image.fromarray(pattern(30, 40, 5, 10)), quality=80)
    return files


def write_png16(path, rgb16):
    import struct
    import zlib

    h, w, _ = rgb16.shape
    raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))

    def chunk(t, d):
        c = t + d
        return struct.pack(">I", len(d)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


# --------------------------------------------------------------------------------------------
# Processor


def make_processor(cfg):
    specials = ["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"] + [
        f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11)
    ]
    t = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", additional_special_tokens=specials)
    tok.image_token = "<image>"
    tok.image_token_id = tok.convert_tokens_to_ids("<image>")
    ip = Lfm2VlImageProcessor(**cfg)
    return Lfm2VlProcessor(image_processor=ip, tokenizer=tok), tok


def rle(tokens):
    out = []
    for t in tokens:
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return out


def run_case(image_name, pil, cfg, special=True):
    proc, tok = make_processor(cfg)
    out = proc(images=[[pil]], text=["<image>"], use_image_special_tokens=special)
    ip_out = proc.image_processor([pil], return_row_col_info=True)
    tokens = tok.convert_ids_to_tokens(out["input_ids"][0])
    text = "".join(tokens)
    assert re.fullmatch(r"(<[^<>]+>)*", text)
    pv = out["pixel_values"]
    shapes = out["spatial_shapes"].tolist()
    mask = out["pixel_attention_mask"]
    tiles_sha, heads = [], []
    for i, (h, w) in enumerate(shapes):
        assert int(mask[i].sum()) == h * w
        v = pv[i, : h * w].contiguous().numpy().astype("<f4")
        tiles_sha.append(sha(v.tobytes()))
        heads.append(f32_hex(v.reshape(-1)[:8]))
    return dict(
        image=image_name,  # a file, or [height, width, seed] for `synthetic`
        config=cfg,
        use_image_special_tokens=special,
        rows=int(ip_out["image_rows"][0]),
        cols=int(ip_out["image_cols"][0]),
        image_size=[int(x) for x in ip_out["image_sizes"][0]],
        spatial_shapes=shapes,
        tiles_sha256=tiles_sha,
        tiles_head=heads,
        placeholder_rle=rle(tokens),
        n_image_tokens=tokens.count("<image>"),
    )


def f32_hex(a) -> str:
    return np.asarray(a, dtype="<f4").tobytes().hex()


def main():
    os.makedirs(OUT, exist_ok=True)
    for n in os.listdir(OUT):
        os.remove(os.path.join(OUT, n))
    assert torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or os.uname().machine in (
        "aarch64",
        "arm64",
    ), "torchvision resizes uint8 in f32 on this CPU: not the reference path"
    torch.set_num_threads(1)
    files = make_images()
    refs = {"decode": {}, "cases": [], "normalize": [], "target_ratios": [], "grid": [], "sizes": [], "resize": []}

    # Decoding.
    pil_images = {}
    for name, path in sorted(files.items()):
        pil = load_image(path)
        a = np.asarray(pil)
        pil_images[name] = pil
        d = {"width": pil.width, "height": pil.height, "sha256_pil": sha(a.tobytes())}
        try:
            t = load_image_as_tensor(path)
            if t.dtype == torch.uint8:
                tb = t.permute(1, 2, 0).contiguous().numpy()
                if tb.shape != a.shape or not np.array_equal(tb, a):
                    d["sha256_torchvision"] = sha(tb.tobytes())
                    if tb.shape == a.shape:
                        d["torchvision_max_abs_diff"] = int(np.abs(tb.astype(int) - a).max())
            else:
                d["torchvision_dtype"] = str(t.dtype)
        except Exception as e:  # noqa: BLE001
            d["torchvision_error"] = str(e)[:200]
        if name == "gray16_20x12.png":
            g = np.asarray(PIL.Image.open(path)).astype(np.uint16)
            d["sha256_high_byte"] = sha(np.repeat((g >> 8).astype(np.uint8)[..., None], 3, -1).tobytes())
        if name == "rgb16_11x9.png":
            # PIL reads 16-bit RGB as "RGB" keeping the high byte; check that here.
            raw = read_png16(path)
            assert np.array_equal((raw >> 8).astype(np.uint8), a)
        refs["decode"][name] = d
    # PIL's pixels of the JPEG, for the decoder's tolerance and the JPEG pipeline case.
    for name in ["exif6_64x48.jpg"]:
        with open(os.path.join(OUT, name + ".pil.rgb"), "wb") as f:
            f.write(np.asarray(pil_images[name]).tobytes())

    # The processor: files (PIL-decoded) and synthetic images.
    def case(src, cfg, special=True):
        if isinstance(src, str):
            pil = pil_images[src]
        else:
            pil = PIL.Image.fromarray(synthetic(*src))
        c = run_case(src, pil, cfg, special)
        refs["cases"].append(c)

    for name in [
        "rgb_37x50.png",
        "rgba_33x21.png",
        "gray_45x33.png",
        "gray_alpha_20x14.png",
        "palette_41x29.gif",
        "palette_trns_23x17.png",
        "exif6_64x48.jpg",
        "exif8_30x20.png",
        "one_1x1.png",
        "lossless_33x21.webp",
        "rgb16_11x9.png",
    ]:
        case(name, SMALL)
    tiles, wide, square, big = [180, 300, 2], [40, 200, 4], [180, 180, 6], [700, 1100, 8]
    for src in [tiles, wide, square, big, [120, 500, 10], [333, 97, 12]]:
        case(src, SMALL)
    case(tiles, {**SMALL, "use_thumbnail": False})
    case(tiles, {**SMALL, "do_image_splitting": False})
    case(tiles, SMALL, special=False)
    case(tiles, {**SMALL, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]})
    case(big, {**SMALL, "max_tiles": 9, "min_tiles": 3})
    # A one-tile grid (min_tiles 1): the tile is tile_size square, the text counts image_sizes.
    case(square, {**SMALL, "min_tiles": 1})
    case([180, 176, 14], {**SMALL, "min_tiles": 1})
    for src in ["rgb_37x50.png", "one_1x1.png", wide, big]:
        case(src, {})

    # Normalization tables: the f32 bits in full for two configs, a SHA-256 for the others.
    values = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16).repeat(1, 3, 1, 1)
    for i, cfg in enumerate(
        [
            {},
            {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
            {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]},
            {"do_normalize": False},
            {"do_rescale": False},
            {"do_rescale": False, "do_normalize": False},
            {"rescale_factor": 1 / 127.5, "image_mean": [1.0, 1.0, 1.0], "image_std": [1.0, 1.0, 1.0]},
        ]
    ):
        ip = Lfm2VlImageProcessor(**cfg)
        r = ip.rescale_and_normalize(
            values.clone(),
            ip.do_rescale,
            ip.rescale_factor,
            ip.do_normalize,
            tuple(ip.image_mean) if isinstance(ip.image_mean, list) else ip.image_mean,
            tuple(ip.image_std) if isinstance(ip.image_std, list) else ip.image_std,
        )
        table = r.to(torch.float32).reshape(3, 256).numpy()
        entry = {"config": cfg, "sha256": sha(table.astype("<f4").tobytes())}
        if i < 2:
            entry["f32_hex"] = f32_hex(table)
        refs["normalize"].append(entry)

    # Grid ratios and layouts.
    ip = Lfm2VlImageProcessor()
    pairs = [(a, b) for a in range(0, 7) for b in range(max(a, 1), 13)] + [(2, 30), (1, 40), (5, 64), (10, 40)]
    for a, b in pairs:
        flat = " ".join(f"{w}x{h}" for w, h in ip._target_ratios(a, b))
        refs["target_ratios"].append({"min": a, "max": b, "ratios": flat})
    grid = []
    rng = np.random.default_rng(99)
    configs = [(2, 10, 512), (2, 4, 128), (1, 4, 128), (6, 6, 64), (4, 12, 100), (8, 8, 32), (12, 12, 16), (1, 9, 48)]
    n_ties = 0
    for mn, mx, ts in configs:
        ratios = ip._target_ratios(mn, mx)
        ties = 0
        # exact ties: images whose aspect ratio is as close to two grids
        for w1, h1 in ratios:
            for w2, h2 in ratios:
                if (w1, h1) >= (w2, h2) or ties >= 12:
                    continue
                mid = (w1 / h1 + w2 / h2) / 2
                for hh in range(1, 200):
                    ww = round(mid * hh)
                    if ww < 1:
                        continue
                    a = ww / hh
                    diffs = sorted(abs(a - x / y) for x, y in ratios)
                    if len(diffs) > 1 and diffs[0] == diffs[1]:
                        for scale in (1, 9):
                            H, W = hh * scale, ww * scale
                            grid.append([H, W, mn, mx, ts, *ip._get_grid_layout(H, W, mn, mx, ts)[:2]])
                        ties += 1
                        break
        n_ties += ties
        for _ in range(20):
            H, W = (int(v) for v in rng.integers(1, 3000, 2))
            grid.append([H, W, mn, mx, ts, *ip._get_grid_layout(H, W, mn, mx, ts)[:2]])
    print(f"{n_ties} aspect-ratio ties", file=sys.stderr)
    refs["grid"] = grid

    # smart_resize / _is_image_too_large.
    size_list = [(1, 1), (1, 5000), (5000, 1), (31, 33), (16, 16), (48, 48), (47, 49), (1000, 1000), (4000, 3000)]
    # halves: Python's round() goes to even
    size_list += [(80, 80), (144, 80), (272, 336), (400, 592), (80, 2000), (15, 700), (700, 17)]
    size_list += [tuple(int(v) for v in rng.integers(1, 2500, 2)) for _ in range(100)]
    size_list += [tuple(int(v) for v in rng.integers(1, 100, 2)) for _ in range(40)]
    for cfg in [{}, SMALL, {**SMALL, "max_pixels_tolerance": 1.25, "min_image_tokens": 9}]:
        ip = Lfm2VlImageProcessor(**cfg)
        rows = []
        for h, w in size_list:
            nw, nh = ip.smart_resize(h, w, ip.downsample_factor, ip.min_image_tokens, ip.max_image_tokens, ip.encoder_patch_size)
            large = ip._is_image_too_large(h, w, ip.max_image_tokens, ip.encoder_patch_size, ip.downsample_factor, ip.max_pixels_tolerance)
            rows.append([h, w, nh, nw, int(large)])
        refs["sizes"].append({"config": cfg, "rows": rows})

    # Resize.
    cases = [(1, 1, 5, 7), (1, 5, 3, 3), (5, 1, 3, 3), (37, 50, 64, 64), (50, 37, 32, 32), (2, 2, 1, 3)]
    cases += [(1500, 7, 17, 700), (9, 2000, 700, 9), (700, 1100, 512, 1024), (513, 511, 512, 512), (180, 300, 96, 160)]
    cases += [(1000, 3, 32, 1), (3, 1000, 1, 32), (640, 480, 1, 1), (2000, 2000, 32, 32), (1, 1, 512, 512)]
    for _ in range(100):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 160, 4))
        cases.append((h, w, oh, ow))
    for _ in range(20):
        h, w = (int(v) for v in rng.integers(1, 1200, 2))
        oh, ow = (int(v) for v in rng.integers(1, 600, 2))
        cases.append((h, w, oh, ow))
    def resizes(mode):
        out_refs = []
        for i, (h, w, oh, ow) in enumerate(cases):
            t = torch.from_numpy(noise(h, w, i)).permute(2, 0, 1).contiguous()
            try:
                r = tvF.resize(t, [oh, ow], interpolation=mode, antialias=True)
            except RuntimeError as e:
                # torch's AVX kernel asserts on some 1x1 outputs (3x3 -> 1x1): skip those.
                print(f"{mode.value} {h}x{w} -> {oh}x{ow} (seed {i}): torch error, skipped: {str(e)[:60]}",
                      file=sys.stderr)
                continue
            out = r.permute(1, 2, 0).contiguous().numpy().tobytes()
            entry = [h, w, oh, ow, i, sha(out)[:32]]
            if len(out) <= 48:
                entry.append(out.hex())
            out_refs.append(entry)
        return out_refs

    refs["resize"] = resizes(tvF.InterpolationMode.BILINEAR)
    # The same resizes with BICUBIC (LFM3-VL's processor, transformers' Qwen2VLImageProcessor).
    refs["resize_bicubic"] = resizes(tvF.InterpolationMode.BICUBIC)

    # Qwen2-VL's smart_resize (LFM3-VL's processor): [h, w, factor, min, max, out_h, out_w],
    # out null where it raises (aspect ratio above 200).
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as qwen_smart_resize

    refs["qwen_sizes"] = []
    qrng = np.random.default_rng(7)
    qcfgs = [(32, 32 * 32 * 4, 32 * 32 * 24), (28, 56 * 56, 28 * 28 * 1280), (32, 256 * 256, 1024 * 1024)]
    dims = [1, 2, 15, 16, 17, 31, 32, 33, 48, 63, 64, 100, 224, 511, 512, 1000, 4000, 7000]
    pairs = [(h, w) for h in dims for w in dims] + [tuple(int(v) for v in qrng.integers(1, 5000, 2)) for _ in range(200)]
    for f, lo, hi in qcfgs:
        for h, w in pairs:
            try:
                oh, ow = qwen_smart_resize(h, w, f, lo, hi)
            except ValueError:
                oh = ow = None
            refs["qwen_sizes"].append([h, w, f, lo, hi, oh, ow])

    with open(os.path.join(OUT, "refs.json"), "w") as f:
        json.dump(refs, f, separators=(",", ":"))
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, {len(refs['cases'])} cases, {len(refs['resize'])} resizes")


def read_png16(path):
    import struct
    import zlib

    data = open(path, "rb").read()
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        t = data[pos + 4 : pos + 8]
        d = data[pos + 8 : pos + 8 + n]
        if t == b"IHDR":
            w, h = struct.unpack(">II", d[:8])
        elif t == b"IDAT":
            idat += d
        pos += 12 + n
    raw = zlib.decompress(idat)
    rows = [np.frombuffer(raw[y * (1 + w * 6) + 1 : (y + 1) * (1 + w * 6)], ">u2") for y in range(h)]
    return np.stack(rows).reshape(h, w, 3)


if __name__ == "__main__":
    main()
