#!/usr/bin/env python3
"""Generate the LFM3-VL fixture ``tests/reference/fixtures/lfm3_vl/`` for lone's tests.

    PYTHONPATH=<torchvision> python tests/reference/vision/generate_lfm3_vl.py

needs torch, transformers 5.24, torchvision (LFM3-VL's image processor, transformers'
``Qwen2VLImageProcessor``, resizes with it) and Pillow. Deterministic (fixed seeds, CPU, eager
attention, float32).

What it makes
-------------
A tiny random-weight ``Lfm3VlForConditionalGeneration`` saved as transformers saves it
(``config.json``, ``model.safetensors``) with its processor (``preprocessor_config.json``,
``processor_config.json``, ``tokenizer.json`` with the vision tokens added, ``chat_template.jinja``):

* vision tower: patch embedding of 16×16×2 (temporal) patches, RMSNorm, 6 layers (gated 3×3
  depthwise convolutions over the patch grid and bidirectional grouped-query attention with 2D
  rotary positions), hidden 64, 4 heads, 2 key/value heads;
* projector: layer norm per patch, 2×2 merge, 256 → 96 → 64 with GELU;
* language model: LFM3 (the ``lfm3`` text fixture's shape: conv, sliding, full, sliding attention).

The processor is set small (4–24 image tokens per image) so that the images exercise its rules:
upscaling to the minimum, downscaling to the maximum, rounding, and an image already on the grid.
LFM3-VL's own chat template is not public here: the fixture's writes each image as
``<|vision_start|><|image_pad|><|vision_end|>`` (what the processor expects to expand).

``images/*.png`` are the inputs; ``cases/<case>/`` as in the LFM2-VL fixture (generate.py):
``input_ids.json``, ``prompt.txt``, ``grid_thw.json``, ``pixel_values.sha256`` (+ ``.npy`` for
``one``), ``vision.npy`` (the tower's output, patches in merge-block order), ``features.npy``,
``logits.npy``, ``greedy.json``, ``greedy_text.json``.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
OUT = ROOT / "tests" / "reference" / "fixtures" / "lfm3_vl"
SEED = 43


def _sibling(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


VL2 = _sibling("lfm2_vl_generate", HERE / "generate.py")
TEXT = VL2._text_generator()

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PROCESSOR = dict(patch_size=16, temporal_patch_size=2, merge_size=2,
                 size={"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 24})

# (height, width): small is upscaled, wide rounded, large downscaled, square and exact kept.
IMAGES = {"small": (45, 70), "wide": (40, 200), "large": (300, 150), "square": (128, 128), "exact": (64, 96)}

CASES = {
    "one": (["small"], "What is this?"),
    "two": (["small", "wide"], "Compare them."),
    "large": (["large"], "Describe."),
    "square": (["square"], "Hi"),
    "exact": (["exact"], "And this?"),
}


def tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(VL2.TINY_TOKENIZER / "tokenizer.json"),
                                  bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  model_max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                          "<|vision_end|>"]})
    return tok


def build(vocab: int, ids: dict):
    import torch
    from transformers import Lfm3VlConfig, Lfm3VlForConditionalGeneration

    text = json.loads((ROOT / "tests" / "reference" / "fixtures" / "lfm3" / "config.json").read_text())
    for k in ("architectures", "dtype", "transformers_version"):
        text.pop(k, None)
    text["vocab_size"] = vocab
    vision = dict(model_type="lfm3_vl_vision", hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, patch_size=16, temporal_patch_size=2,
                  spatial_merge_size=2, conv_kernel_size=3, norm_eps=1e-5,
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    cfg = Lfm3VlConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                       video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                       vision_end_token_id=ids["<|vision_end|>"], projector_hidden_size=96,
                       projector_hidden_act="gelu", projector_bias=True, tie_word_embeddings=True)
    assert cfg.vision_config.layer_types == ["conv", "conv", "full_attention", "conv", "full_attention", "conv"]
    torch.manual_seed(0)
    model = Lfm3VlForConditionalGeneration(cfg).float().eval()
    TEXT.randomize_(model, SEED)
    # randomize_ knows the text models' conv weights by `conv.conv`; the vision tower's 3×3
    # kernels get the same spread.
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "spatial_conv" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def run_case(model, processor, name: str, images, text: str) -> dict:
    import torch

    out = OUT / "cases" / name
    out.mkdir(parents=True)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=False)
    enc = processor(images=images, text=prompt, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    pv, grid = enc["pixel_values"].float().contiguous(), enc["image_grid_thw"]
    (out / "pixel_values.sha256").write_text(hashlib.sha256(pv.numpy().tobytes()).hexdigest() + "\n")
    if name == "one":
        VL2.save_np(out / "pixel_values.npy", pv)
    (out / "grid_thw.json").write_text(json.dumps(grid.tolist()) + "\n")
    (out / "input_ids.json").write_text(json.dumps(ids) + "\n")
    (out / "prompt.txt").write_text(prompt)
    image_token_id = model.config.image_token_id

    with torch.no_grad():
        inner = model.model
        vis = inner.vision_tower(pv, grid_thw=grid)
        VL2.save_np(out / "vision.npy", vis.last_hidden_state)
        feats = torch.cat(inner.get_image_features(pv, grid).pooler_output)
        VL2.save_np(out / "features.npy", feats)
        n_img = sum(1 for t in ids if t == image_token_id)
        assert n_img == feats.shape[0], (n_img, feats.shape)

        gen, logits = VL2.greedy_with_features(model, ids, image_token_id, feats)
        full = model(input_ids=torch.tensor([ids]), pixel_values=pv, image_grid_thw=grid, use_cache=False).logits[0]
        assert torch.allclose(full, logits[:len(ids)], atol=1e-5)
    VL2.save_np(out / "logits.npy", logits)
    (out / "greedy.json").write_text(json.dumps(gen) + "\n")
    (out / "greedy_text.json").write_text(json.dumps(processor.tokenizer.decode(gen, skip_special_tokens=True)) + "\n")
    top2 = logits[len(ids) - 1:-1].topk(2, -1).values
    return {"text": text, "prompt_len": len(ids), "image_tokens": n_img, "grid_thw": grid.tolist(),
            "greedy_distinct": len(set(gen)), "greedy_min_margin": float((top2[:, 0] - top2[:, 1]).min())}


def main() -> None:
    import torch
    import transformers
    from PIL import Image
    from transformers import Lfm3VlProcessor, Qwen2VLImageProcessor, Qwen3VLVideoProcessor

    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "images").mkdir(parents=True)
    tok = tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                     "<|vision_end|>"]}
    vocab = -(-len(tok) // 32) * 32
    model = build(vocab, ids)
    model.config._attn_implementation = "eager"
    model.save_pretrained(str(OUT))
    processor = Lfm3VlProcessor(image_processor=Qwen2VLImageProcessor(**PROCESSOR), tokenizer=tok,
                                video_processor=Qwen3VLVideoProcessor(patch_size=16, merge_size=2),
                                chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(OUT))

    ref, processor = VL2.reload(model, OUT)
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor", type(processor.image_processor)

    for name, (h, w) in IMAGES.items():
        VL2.make_image(name, h, w).save(OUT / "images" / f"{name}.png")
    meta = {"token_ids": ids, "vocab_size": vocab, "n_greedy": VL2.N_GREEDY, "processor": PROCESSOR,
            "images": {k: list(v) for k, v in IMAGES.items()}, "cases": {},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    for case, (names, text) in CASES.items():
        imgs = [Image.open(OUT / "images" / f"{n}.png").convert("RGB") for n in names]
        meta["cases"][case] = {"images": names, **run_case(ref, processor, case, imgs, text)}
        print(case, meta["cases"][case])
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    write_ggufs()


# ---------------------------------------------------------------------------------------------
# The GGUF pair. llama.cpp has neither LFM3 nor LFM3-VL: the language model is written as the
# lfm3 text fixture's GGUFs are (generate.py's write_lfm3_ggufs), the vision side as an mmproj
# in llama.cpp's conventions (DEVELOPERS.md "LFM3-VL in GGUF"; this function is its executable
# spec: `lone convert --mmproj` writes the same bytes).

MMPROJ_TYPES = ["f32", "f16", "q8_0"]


def mmproj_name(hf: str) -> list[str]:
    """The mmproj names of an HF tensor (the patch embedding's temporal halves are two)."""
    if hf.startswith("model.multi_modal_projector."):
        mod, suf = hf.removeprefix("model.multi_modal_projector.").rsplit(".", 1)
        return [{"layer_norm": "mm.input_norm", "linear_1": "mm.1", "linear_2": "mm.2"}[mod] + "." + suf]
    rest = hf.removeprefix("model.vision_tower.")
    if rest in ("patchifier.weight", "patch_embed.weight"):  # the Hub's name, transformers' in memory
        return ["v.patch_embd.weight", "v.patch_embd.weight.1"]
    if rest == "embedding_norm.weight":
        return ["v.norm_embd.weight"]
    _, n, mod = rest.split(".", 2)
    mod, suf = mod.rsplit(".", 1)
    g = {"operator_norm": "ln1", "ffn_norm": "ln2", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out", "self_attn.q_layernorm": "attn_q_norm",
         "self_attn.k_layernorm": "attn_k_norm", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "conv.in_proj": "shortconv.in_proj",
         "conv.spatial_conv": "shortconv.conv", "conv.out_proj": "shortconv.out_proj",
         "feed_forward.w1": "ffn_gate", "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down"}[mod]
    return [f"v.blk.{n}.{g}.{suf}"]


def mmproj_tensors(sd: dict, cfg: dict, kind: str, gguf) -> list:
    """(name, data, type) of every mmproj tensor, in the checkpoint's name order. Types as
    convert_hf_to_gguf.py's MmprojModel chooses them: 1-D tensors and the depthwise kernels F32,
    the patch embedding F16 in an F16 file and F32 otherwise, the rest the file's type (F16 where
    a row is not whole blocks)."""
    import numpy as np

    vc = cfg["vision_config"]
    p, t = vc["patch_size"], vc["temporal_patch_size"]
    assert t == 2, "the mmproj stores the two temporal halves of the patch embedding"
    qtypes = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
              "q8_0": gguf.GGMLQuantizationType.Q8_0}
    out = []
    for hf in sorted(k for k in sd if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))):
        data = sd[hf].astype(np.float32)
        names = mmproj_name(hf)
        if len(names) == 2:  # [D, 3·T·p·p] as (c, t, y, x) -> two conv kernels [D, 3, p, p]
            d = data.shape[0]
            halves = data.reshape(d, 3, t, p, p)
            parts = [(names[i], np.ascontiguousarray(halves[:, :, i])) for i in range(t)]
        else:
            parts = [(names[0], data)]
        for name, x in parts:
            qt = qtypes[kind]
            if x.ndim <= 1 or ".shortconv.conv." in name:
                qt = gguf.GGMLQuantizationType.F32
            elif name.startswith("v.patch_embd."):
                qt = gguf.GGMLQuantizationType.F16 if kind == "f16" else gguf.GGMLQuantizationType.F32
            elif x.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0]:
                qt = gguf.GGMLQuantizationType.F16
            out.append((name, x, qt))
    return out


def write_mmproj(kind: str, gguf) -> dict:
    """``mmproj-<kind>.gguf``; returns {hf or mmproj name: the file's values, dequantized, in the
    checkpoint's layout} for the reference run on the file's own numbers."""
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((OUT / "config.json").read_text())
    vc = cfg["vision_config"]
    ip = json.loads((OUT / "processor_config.json").read_text())["image_processor"]
    sd = load_file(str(OUT / "model.safetensors"))
    ftypes = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
    path = OUT / f"mmproj-{kind}.gguf"
    tensors = mmproj_tensors(sd, cfg, kind, gguf)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    # general.name and the size label as llama.cpp's converter derives them (the checkpoint's
    # directory name; the parameters written)
    w.add_name("Lfm3_Vl")
    w.add_size_label(gguf.size_label(sum(x.size for _, x, _ in tensors), 0, 0, 0))
    w.add_file_type(ftypes[kind])
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(cfg["text_config"]["hidden_size"])
    w.add_vision_patch_size(vc["patch_size"])
    w.add_vision_embedding_length(vc["hidden_size"])
    w.add_vision_feed_forward_length(vc["intermediate_size"])
    w.add_vision_block_count(vc["num_hidden_layers"])
    w.add_vision_head_count(vc["num_attention_heads"])
    w.add_vision_image_mean(ip["image_mean"])
    w.add_vision_image_std(ip["image_std"])
    w.add_clip_projector_type("lfm3")
    w.add_vision_head_count_kv(vc["num_key_value_heads"])
    w.add_vision_attention_layernorm_eps(vc["norm_eps"])
    w.add_vision_spatial_merge_size(vc["spatial_merge_size"])
    w.add_vision_min_pixels(ip["size"]["shortest_edge"])
    w.add_vision_max_pixels(ip["size"]["longest_edge"])
    w.add_vision_use_gelu(True)
    # no llama.cpp key for these yet: named as the nearest existing ones
    # (clip.vision.is_deepstack_layers, clip.audio.conv_kernel_size, {arch}.rope.freq_base)
    w.add_array("clip.vision.is_conv_layers", [t == "conv" for t in vc["layer_types"]])
    w.add_uint32("clip.vision.conv_kernel_size", vc["conv_kernel_size"])
    w.add_float32("clip.vision.rope.freq_base", vc["rope_parameters"]["rope_theta"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    back = {}
    for name, x, qt in tensors:
        q = gguf.quants.quantize(x, qt)
        w.add_tensor(name, q, raw_dtype=qt)
        back[name] = gguf.quants.dequantize(q, qt).reshape(x.shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"   wrote {path.name}", flush=True)
    return back


def dequantized_state(model, back: dict) -> dict:
    """The vision tower and projector parameters of `model` replaced by an mmproj's values."""
    import numpy as np
    import torch

    state = {}
    for hf, p in model.state_dict().items():
        if not hf.startswith(("model.vision_tower.", "model.multi_modal_projector.")):
            continue
        names = mmproj_name(hf)
        x = np.stack([back[n] for n in names], axis=2).reshape(p.shape) if len(names) == 2 else back[names[0]]
        state[hf] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(p.shape)
    return state


def write_ggufs() -> None:
    """The pair: ``model-f32.gguf`` (the language model) and ``mmproj-{f32,f16,q8_0}.gguf``;
    for the f16/q8_0 files, ``cases/<case>/features-<kind>.npy``: transformers' image features
    with the vision weights the file holds (dequantized by gguf-py)."""
    import tempfile

    import numpy as np
    import torch
    from PIL import Image
    from safetensors.numpy import load_file, save_file

    gguf = TEXT._import_gguf()
    cfg = json.loads((OUT / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text_cfg = {"architectures": ["Lfm3ForCausalLM"], **cfg["text_config"]}
        (tmp / "config.json").write_text(json.dumps(text_cfg))
        sd = load_file(str(OUT / "model.safetensors"))
        lm = {k.replace("model.language_model.", "model.", 1): v for k, v in sd.items()
              if k.startswith("model.language_model.")}
        save_file(lm, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(OUT / f, tmp / f)
        # general.name as llama.cpp's converter derives it from the checkpoint's directory
        TEXT.write_lfm3_ggufs("lfm3_vl", src=tmp, types=["f32"], display="Lfm3_Vl")
        shutil.copy(tmp / "model-f32.gguf", OUT / "model-f32.gguf")

    from transformers import AutoModelForImageTextToText, AutoProcessor

    ref = AutoModelForImageTextToText.from_pretrained(str(OUT), dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(str(OUT))
    meta = json.loads((OUT / "meta.json").read_text())
    for kind in MMPROJ_TYPES:
        back = write_mmproj(kind, gguf)
        if kind == "f32":
            continue
        state = dequantized_state(ref, back)
        model = copy_with(ref, state)
        for case, m in meta["cases"].items():
            imgs = [Image.open(OUT / "images" / f"{n}.png").convert("RGB") for n in m["images"]]
            prompt = (OUT / "cases" / case / "prompt.txt").read_text()
            enc = processor(images=imgs, text=prompt, return_tensors="pt")
            with torch.no_grad():
                feats = torch.cat(model.model.get_image_features(enc["pixel_values"].float(),
                                                                enc["image_grid_thw"]).pooler_output)
            f32 = np.load(OUT / "cases" / case / "features.npy")
            diff = float(np.abs(feats.numpy() - f32).max())
            print(f"   {kind} {case}: features differ from the f32 weights' by {diff:.2e}", flush=True)
            assert diff > 1e-4, "the reference must tell this file's weights from the checkpoint's"
            VL2.save_np(OUT / "cases" / case / f"features-{kind}.npy", feats)


def copy_with(model, state: dict):
    import copy

    m = copy.deepcopy(model)
    missing = set(state) - set(m.state_dict())
    assert not missing, missing
    m.load_state_dict(state, strict=False)
    return m.eval()


if __name__ == "__main__":
    if sys.argv[1:] == ["--ggufs"]:
        sys.exit(write_ggufs())
    sys.exit(main())
