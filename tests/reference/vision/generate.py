#!/usr/bin/env python3
"""Generate the vision-language fixture ``tests/reference/fixtures/lfm2_vl/`` for lone's tests.

    PYTHONPATH=<torchvision> python tests/reference/vision/generate.py

needs torch, transformers 5.24, torchvision (the LFM2-VL image processor resizes with it) and
Pillow. Everything is deterministic (fixed seeds, CPU, eager attention, float32).

What it makes
-------------
A tiny random-weight ``Lfm2VlForConditionalGeneration`` saved as transformers saves it
(``config.json``, ``model.safetensors``), with its processor (``preprocessor_config.json``,
``processor_config.json``, ``tokenizer.json`` with the image tokens added, ``chat_template.jinja``):

* vision tower: SigLIP2 NaFlex, hidden 32, 2 layers, 2 heads, patch 16, an 8×8 position grid;
* projector: pixel-unshuffle by 2, layer norm, 128 → 48 → 64 with GELU;
* language model: LFM2 (hidden 64, layers conv, conv, attention, conv, attention).

The processor is set small (tile 128 px, 4–16 image tokens per image, 2–4 tiles) so that the
test images exercise every rule: upscaling to the minimum, downscaling, tiling with a
thumbnail, tiling turned off.

``images/*.png`` are the inputs; ``cases/<case>/`` holds, for one chat turn with some images:

* ``input_ids.json``: the prompt after the processor expanded each ``<image>`` and the chat
  template ran; ``greedy.json``: 12 greedy tokens (full forward over inputs_embeds each step),
  ``greedy_text.json`` their text (special tokens skipped);
* ``spatial_shapes.json`` (patch rows × columns of each tile, thumbnail last), ``rows_cols.json``;
* ``pixel_values.sha256``: the digest of the unpadded patches' float32 bytes, tile after tile
  (``pixel_values.npy`` in full for the ``one`` case);
* ``vision.npy``: the vision tower's ``last_hidden_state`` of each tile's patches, concatenated;
* ``features.npy``: the projector's outputs (the embeddings that replace the image tokens);
* ``logits.npy``: one forward pass over prompt + greedy tokens, every row.

``model-f32.gguf`` and ``mmproj-f32.gguf`` are llama.cpp's converter's pair (``convert_ggufs``);
``mmproj-f16.gguf`` and ``mmproj-q8_0.gguf`` its ``--outtype f16`` / ``q8_0`` mmproj, with their
own references (``mmproj_types``; ``python generate.py --mmproj-types`` adds just those to an
existing fixture): ``cases/<case>/features-{f16,q8_0}.npy``, the projector's outputs with the
mmproj's tensors dequantized by gguf-py in place of the checkpoint's vision weights (more than
1e-4 from ``features.npy`` — 7e-4 to 9e-4 at f16, 0.012 to 0.015 at q8_0), and
``cases/tiled/greedy-q8_0.json`` (with the f32 language model; the same tokens as
``greedy.json``: these weights move the features too little to change them).
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

def _text_generator():
    """tests/reference/generate.py (the text fixtures' generator) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference_generate", HERE.parent / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ROOT = HERE.parent.parent.parent
OUT = ROOT / "tests" / "reference" / "fixtures" / "lfm2_vl"
TINY_TOKENIZER = ROOT / "tests" / "reference" / "fixtures" / "lfm2_a"
SEED = 41
N_GREEDY = 12
MAX_TILES = 4

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PROCESSOR = dict(
    downsample_factor=2,
    do_image_splitting=True,
    min_tiles=2,
    max_tiles=MAX_TILES,
    use_thumbnail=True,
    min_image_tokens=4,
    max_image_tokens=16,
    encoder_patch_size=16,
    tile_size=128,
    max_pixels_tolerance=2.0,
)

# (height, width) of each test image and how it is drawn.
IMAGES = {"small": (45, 70), "wide": (40, 200), "large": (300, 150), "square": (128, 128)}

# case -> (images in the user turn, text after them, processor overrides)
CASES = {
    "one": (["small"], "What is this?", {}),
    "two": (["small", "wide"], "Compare them.", {}),
    "tiled": (["large"], "Describe.", {}),
    "untiled": (["large"], "Describe.", {"do_image_splitting": False}),
    "square": (["square"], "Hi", {}),
}


def make_image(name: str, h: int, w: int):
    """A smooth picture with some texture (so that resizing has something to average)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(sum(map(ord, name)))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127 + 100 * np.sin(x / 9.0 + y / 23.0)
    g = 127 + 100 * np.cos(y / 7.0 - x / 31.0)
    b = 255 * (x + y) / (h + w)
    img = np.stack([r, g, b], -1) + rng.normal(0, 18, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def tokenizer(out: Path):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(TINY_TOKENIZER / "tokenizer.json"), bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=4096)
    rows = [f"<|img_row_{r}_col_{c}|>" for r in range(1, MAX_TILES + 1) for c in range(1, MAX_TILES + 1)]
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<|image_start|>", "<|image_end|>",
                                                          "<|img_thumbnail|>", *rows]})
    return tok


def build(vocab: int, image_token_id: int):
    import torch
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    text = dict(model_type="lfm2", vocab_size=vocab, hidden_size=64, num_hidden_layers=5, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, block_auto_adjust_ff_dim=False,
                layer_types=["conv", "conv", "full_attention", "conv", "full_attention"], conv_L_cache=3,
                norm_eps=1e-5, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)
    # 3 layers: llama.cpp's converter maps the projector's linear_1/linear_2 as blocks of the
    # vision tower, so it needs at least 3 of them.
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, patch_size=16, num_patches=64, vision_use_head=False,
                  layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")
    cfg = Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=image_token_id,
                       projector_hidden_size=48, projector_hidden_act="gelu", downsample_factor=2,
                       projector_bias=True, projector_use_layernorm=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Lfm2VlForConditionalGeneration(cfg).float().eval()
    # The text fixtures' initialisation; the position grid larger (its resizing matters).
    _text_generator().randomize_(model, SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "position_embedding" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def save_np(path: Path, t) -> None:
    import numpy as np

    np.save(str(path), t.detach().cpu().numpy().astype(np.float32))


def reload(model, out: Path):
    """The checkpoint and processor saved in `out`, read back (the references come from what
    the fixture holds), the weights checked against `model`'s."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    ref = AutoModelForImageTextToText.from_pretrained(str(out), dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k
    return ref, AutoProcessor.from_pretrained(str(out))


def greedy_with_features(model, ids: list[int], image_token_id: int, feats):
    """N_GREEDY greedy tokens after `ids` with `feats` in place of the image tokens (a full
    forward over inputs_embeds each step), and the logits of every row of prompt + tokens."""
    import torch

    embed = model.model.get_input_embeddings()
    x = embed(torch.tensor([ids]))
    m = (torch.tensor([ids]) == image_token_id)[..., None]
    x = x.masked_scatter(m, feats)
    gen = []
    for _ in range(N_GREEDY):
        logits = model(inputs_embeds=x, use_cache=False).logits[0]
        t = int(logits[-1].argmax())
        gen.append(t)
        x = torch.cat([x, embed(torch.tensor([[t]]))], 1)
    logits = model(inputs_embeds=x, use_cache=False).logits[0]
    assert [int(v) for v in logits[len(ids) - 1:-1].argmax(-1)] == gen
    return gen, logits


def encode_turn(processor, images, text: str, overrides: dict):
    """One user turn (the images, then `text`) through the chat template and the processor:
    the prompt text and the processor's tensors."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    return prompt, processor(images=[images], text=prompt, return_tensors="pt", **overrides)


def image_features(model, enc):
    """The projector's outputs for `enc`'s images, tile after tile (the rows that replace the
    image tokens)."""
    import torch

    with torch.no_grad():
        return torch.cat(model.model.get_image_features(enc["pixel_values"], enc["spatial_shapes"],
                                                        enc["pixel_attention_mask"]).pooler_output)


def run_case(model, processor, name: str, images, text: str, overrides: dict) -> dict:
    import torch

    out = OUT / "cases" / name
    out.mkdir(parents=True)
    prompt, enc = encode_turn(processor, images, text, overrides)
    ids = enc["input_ids"][0].tolist()
    pv, mask, shapes = enc["pixel_values"], enc["pixel_attention_mask"], enc["spatial_shapes"]
    valid = [pv[i][mask[i].bool()] for i in range(pv.shape[0])]
    flat = torch.cat(valid).float().contiguous()
    assert flat.shape[0] == int(shapes.prod(-1).sum())
    (out / "pixel_values.sha256").write_text(hashlib.sha256(flat.numpy().tobytes()).hexdigest() + "\n")
    if name == "one":
        save_np(out / "pixel_values.npy", flat)
    (out / "spatial_shapes.json").write_text(json.dumps(shapes.tolist()) + "\n")
    (out / "input_ids.json").write_text(json.dumps(ids) + "\n")
    (out / "prompt.txt").write_text(prompt)

    with torch.no_grad():
        inner = model.model
        vis = inner.vision_tower(pixel_values=pv, spatial_shapes=shapes, pixel_attention_mask=mask)
        lhs = torch.cat([vis.last_hidden_state[i][mask[i].bool()] for i in range(pv.shape[0])])
        save_np(out / "vision.npy", lhs)
        feats = image_features(model, enc)
        save_np(out / "features.npy", feats)
        n_img = sum(1 for t in ids if t == model.config.image_token_id)
        assert n_img == feats.shape[0], (n_img, feats.shape)

        gen, logits = greedy_with_features(model, ids, model.config.image_token_id, feats)
        full = model(input_ids=torch.tensor([ids]), pixel_values=pv, spatial_shapes=shapes,
                     pixel_attention_mask=mask, use_cache=False).logits[0]
        assert torch.allclose(full, logits[:len(ids)], atol=1e-5)
    save_np(out / "logits.npy", logits)
    (out / "greedy.json").write_text(json.dumps(gen) + "\n")
    (out / "greedy_text.json").write_text(json.dumps(processor.tokenizer.decode(gen, skip_special_tokens=True)) + "\n")
    top2 = logits[len(ids) - 1:-1].topk(2, -1).values
    return {"text": text, "overrides": overrides, "prompt_len": len(ids),
            "image_tokens": n_img, "tiles": len(valid), "spatial_shapes": shapes.tolist(),
            "greedy_distinct": len(set(gen)), "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min())}


LLAMA_CPP = Path.home() / ".cache" / "llama.cpp-0c1e570" / "src"


def convert_ggufs() -> dict:
    """llama.cpp's converter on the checkpoint: the language model and the `mmproj` (vision
    tower + projector), both f32 — the pair llama-mtmd-cli reads. The f32 pair holds the same
    numbers as the checkpoint, so the cases' references apply to it unchanged."""
    import subprocess

    # The language model through the text fixtures' converter run (it knows the fixture
    # tokenizer's pre-tokenizer); the mmproj has no vocabulary.
    text_gen = HERE.parent / "generate.py"
    jobs = json.dumps([["f32", str(OUT / "model-f32.gguf")]])
    subprocess.run([sys.executable, str(text_gen), "--convert", str(OUT), jobs], check=True)
    env = {**os.environ, "PYTHONPATH": str(LLAMA_CPP / "gguf-py")}
    conv = [sys.executable, str(LLAMA_CPP / "convert_hf_to_gguf.py"), str(OUT), "--outtype", "f32"]
    subprocess.run([*conv, "--mmproj", "--outfile", str(OUT / "mmproj-f32.gguf")], check=True, env=env)
    return {"text": "model-f32.gguf", "mmproj": "mmproj-f32.gguf", "converter": "llama.cpp 0c1e570"}


MMPROJ_TYPES = ["f16", "q8_0"]
# The case whose greedy tokens are also stored for a quantized mmproj (`greedy-q8_0.json`).
MMPROJ_GREEDY = {"q8_0": "tiled"}

_VT, _MM = "model.vision_tower.", "model.multi_modal_projector."
# The mmproj's tensor names (llama.cpp's clip names) -> the transformers parameters they hold.
MMPROJ_TO_HF = {
    "v.patch_embd": _VT + "embeddings.patch_embedding",
    "v.position_embd": _VT + "embeddings.position_embedding",
    "v.post_ln": _VT + "post_layernorm",
    "mm.input_norm": _MM + "layer_norm",
    "mm.1": _MM + "linear_1",
    "mm.2": _MM + "linear_2",
}
MMPROJ_BLOCK_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
}


def mmproj_hf_name(name: str) -> str:
    """The transformers parameter an mmproj tensor holds (`v.blk.1.attn_out.weight` ->
    `model.vision_tower.encoder.layers.1.self_attn.out_proj.weight`)."""
    base, suffix = name.rsplit(".", 1)
    if base in MMPROJ_TO_HF:
        return f"{MMPROJ_TO_HF[base]}.{suffix}"
    v, blk, bid, rest = base.split(".", 3)
    assert (v, blk) == ("v", "blk") and bid.isdigit(), name
    return f"{_VT}encoder.layers.{bid}.{MMPROJ_BLOCK_TO_HF[rest]}.{suffix}"


def _import_gguf():
    sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
    import gguf

    # llama.cpp's own gguf-py (the PyPI package may lag behind the converter that wrote the file).
    assert Path(gguf.__file__).resolve().is_relative_to(LLAMA_CPP.resolve()), gguf.__file__
    return gguf


def mmproj_weights(path: Path, model) -> tuple[dict, dict]:
    """The mmproj's tensors dequantized to f32 by gguf-py (what ggml's dequantize gives) under
    their transformers names, checked to cover every vision-tower and projector parameter of
    `model` with its shape; and how many tensors of each GGUF type the file holds."""
    import numpy as np
    import torch

    gguf = _import_gguf()
    params = dict(model.named_parameters())
    want = {k for k in params if k.startswith((_VT, _MM))}
    weights, types = {}, {}
    for t in gguf.GGUFReader(str(path)).tensors:
        hf = mmproj_hf_name(t.name)
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = torch.from_numpy(w.reshape([int(n) for n in reversed(t.shape)]))
        if t.name == "v.patch_embd.weight":
            # The converter stores the [D, 16·16·3] linear as a conv kernel:
            # view(D, 16, 16, 3).permute(0, 3, 1, 2). Undone.
            w = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)
        assert hf in want and hf not in weights, (t.name, hf)
        assert tuple(w.shape) == tuple(params[hf].shape), (t.name, hf, w.shape, params[hf].shape)
        weights[hf] = w
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert set(weights) == want, sorted(want - set(weights))
    return weights, types


def mmproj_types(types: list[str] = MMPROJ_TYPES) -> None:
    """llama.cpp's converter writes the mmproj at each of `types` (`mmproj-<type>.gguf`; at
    q8_0 it keeps the tensors it keeps F32/F16), and the reference for each: the f32
    transformers model with its vision tower and projector replaced by the mmproj's tensors
    dequantized by gguf-py, through every case of meta.json with the processor's pixel values:
    `cases/<case>/features-<type>.npy` (the projector's outputs, as `features.npy` for the
    checkpoint's weights) and, for the cases of MMPROJ_GREEDY, `greedy-<type>.json` (the
    language model is the checkpoint's, f32). Only adds files to the fixture; the mmproj-f32
    file maps back to the checkpoint's weights exactly (the name map's check)."""
    import copy
    import subprocess

    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    env = {**os.environ, "PYTHONPATH": str(LLAMA_CPP / "gguf-py")}
    for t in types:
        conv = [sys.executable, str(LLAMA_CPP / "convert_hf_to_gguf.py"), str(OUT), "--outtype", t]
        subprocess.run([*conv, "--mmproj", "--outfile", str(OUT / f"mmproj-{t}.gguf")], check=True, env=env)

    meta = json.loads((OUT / "meta.json").read_text())
    base = AutoModelForImageTextToText.from_pretrained(str(OUT), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(str(OUT))
    f32, _ = mmproj_weights(OUT / "mmproj-f32.gguf", base)
    params = dict(base.named_parameters())
    for k, w in f32.items():
        assert torch.equal(w, params[k]), k
    models = {}
    for t in types:
        weights, counts = mmproj_weights(OUT / f"mmproj-{t}.gguf", base)
        print(f"mmproj-{t}.gguf: {counts}", flush=True)
        m = models[t] = copy.deepcopy(base)
        with torch.no_grad():
            for k, p in m.named_parameters():
                if k in weights:
                    p.copy_(weights[k])
    for case, c in meta["cases"].items():
        out = OUT / "cases" / case
        images = [Image.open(OUT / "images" / f"{n}.png") for n in c["images"]]
        prompt, enc = encode_turn(processor, images, c["text"], c["overrides"])
        ids = enc["input_ids"][0].tolist()
        assert prompt == (out / "prompt.txt").read_text(), case
        assert ids == json.loads((out / "input_ids.json").read_text()), case
        want = torch.from_numpy(np.load(out / "features.npy"))
        assert float((image_features(base, enc) - want).abs().max()) <= 1e-6, case
        for t, m in models.items():
            feats = image_features(m, enc)
            d = float((feats - want).abs().max())
            print(f"{case} {t}: max |features-{t} - features| {d:.3g}", flush=True)
            # A test reading the f32 weights (or features.npy) instead must fail at 1e-4.
            assert d > 1e-4, (case, t, d)
            save_np(out / f"features-{t}.npy", feats)
            if MMPROJ_GREEDY.get(t) == case:
                with torch.no_grad():
                    gen, logits = greedy_with_features(m, ids, m.config.image_token_id, feats)
                top2 = logits[len(ids) - 1:-1].topk(2, -1).values
                margin = float((top2[:, 0] - top2[:, 1]).min())
                f32_gen = json.loads((out / "greedy.json").read_text())
                print(f"{case} {t}: greedy {gen} (checkpoint's weights: {f32_gen}), least top-2 margin "
                      f"{margin:.3g}", flush=True)
                assert margin > 1e-3, margin
                (out / f"greedy-{t}.json").write_text(json.dumps(gen) + "\n")


def main() -> None:
    import torch
    import transformers
    from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor

    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "images").mkdir(parents=True)
    tok = tokenizer(OUT)
    image_token_id = tok.convert_tokens_to_ids("<image>")
    vocab = -(-len(tok) // 32) * 32
    model = build(vocab, image_token_id)
    model.config._attn_implementation = "eager"
    model.save_pretrained(str(OUT))
    # The Hub's LFM2-VL configs name the language model's class in text_config (llama.cpp's
    # converter picks the text model by it); transformers 5 does not write it.
    cfg = json.loads((OUT / "config.json").read_text())
    cfg["text_config"]["architectures"] = ["Lfm2ForCausalLM"]
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # ... and keep the vision tower under `vision_tower.vision_model.` (transformers 5 reads that
    # layout and writes a flatter one; llama.cpp's converter knows only the Hub's).
    from safetensors.torch import load_file, save_file

    st = load_file(str(OUT / "model.safetensors"))
    st = {k.replace("model.vision_tower.", "model.vision_tower.vision_model."): v for k, v in st.items()}
    save_file(st, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    processor = Lfm2VlProcessor(image_processor=Lfm2VlImageProcessor(**PROCESSOR), tokenizer=tok,
                                chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(OUT))

    ref, processor = reload(model, OUT)

    from PIL import Image

    for name, (h, w) in IMAGES.items():
        make_image(name, h, w).save(OUT / "images" / f"{name}.png")
    meta = {"image_token_id": image_token_id, "vocab_size": vocab, "n_greedy": N_GREEDY, "processor": PROCESSOR,
            "images": {k: list(v) for k, v in IMAGES.items()}, "cases": {},
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    for case, (names, text, overrides) in CASES.items():
        imgs = [Image.open(OUT / "images" / f"{n}.png") for n in names]
        meta["cases"][case] = {"images": names, **run_case(ref, processor, case, imgs, text, overrides)}
        print(case, meta["cases"][case])
    meta["gguf"] = convert_ggufs()
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    mmproj_types()


if __name__ == "__main__":
    if sys.argv[1:] == ["--mmproj-types"]:
        sys.exit(mmproj_types())
    sys.exit(main())
