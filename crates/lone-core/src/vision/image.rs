//! Image decoding and the LFM2-VL image processor: transformers 5.24's `Lfm2VlImageProcessor`
//! (torchvision backend) and the `<image>` expansion of `Lfm2VlProcessor`, bit for bit.
//!
//! The pipeline for one image:
//! 1. [`decode`]: PNG, JPEG, WebP or GIF (first frame) bytes → upright 8-bit RGB, as
//!    transformers' `load_image` does (`PIL.ImageOps.exif_transpose`, then `.convert("RGB")`,
//!    which drops alpha without compositing).
//! 2. [`preprocess`]: an image too large for one tile (`_is_image_too_large`) is resized to a
//!    grid of `tile_size` tiles (the grid whose aspect ratio is closest, `_target_ratios` and
//!    `find_closest_aspect_ratio`) plus, with `use_thumbnail`, a thumbnail at the
//!    `smart_resize` size; any other image is resized to its `smart_resize` size. Every resize
//!    is torchvision's `resize(uint8, BILINEAR, antialias=True)`, which on CPU is torch's
//!    separable fixed-point uint8 kernel ([`resize_bilinear_aa`]). Then rescale and normalize
//!    (transformers fuses them: `(x − mean/rf) / (std/rf)` in f32) and cut each tile into
//!    `encoder_patch_size` patches, row-major, each flattened in (y, x, channel) order.
//! 3. [`Processed::placeholder`]: the text that replaces the prompt's `<image>`.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageError, ImageReader, Limits};
use serde_json::Value;

use crate::error::{Error, Result};

/// The image processor's settings (`preprocessor_config.json` or the `image_processor` object
/// of `processor_config.json`) and the processor's `use_image_special_tokens`.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessorConfig {
    pub downsample_factor: usize,
    pub do_image_splitting: bool,
    pub min_tiles: usize,
    pub max_tiles: usize,
    pub use_thumbnail: bool,
    pub min_image_tokens: usize,
    pub max_image_tokens: usize,
    pub encoder_patch_size: usize,
    pub tile_size: usize,
    pub max_pixels_tolerance: f64,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub use_image_special_tokens: bool,
}

impl Default for ProcessorConfig {
    /// transformers' class defaults (`Lfm2VlImageProcessor`, `Lfm2VlProcessor`).
    fn default() -> Self {
        ProcessorConfig {
            downsample_factor: 2,
            do_image_splitting: true,
            min_tiles: 2,
            max_tiles: 10,
            use_thumbnail: true,
            min_image_tokens: 64,
            max_image_tokens: 256,
            encoder_patch_size: 16,
            tile_size: 512,
            max_pixels_tolerance: 2.0,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            use_image_special_tokens: true,
        }
    }
}

/// The largest `max_tiles` accepted (transformers has no limit; the grid search is quadratic).
const MAX_TILES_LIMIT: usize = 1024;

pub(crate) fn cfg_err(msg: impl Into<String>) -> Error {
    Error::Config(format!("image processor config: {}", msg.into()))
}

type JsonMap = serde_json::Map<String, Value>;

/// A processor setting that is a non-negative integer, `d` when absent or null.
pub(crate) fn json_uint(o: &JsonMap, k: &str, d: usize) -> Result<usize> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(d),
        Some(x) => x
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| cfg_err(format!("{k} must be a non-negative integer"))),
    }
}

/// A processor setting that is true or false, `d` when absent or null.
pub(crate) fn json_bool(o: &JsonMap, k: &str, d: bool) -> Result<bool> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(d),
        Some(x) => x
            .as_bool()
            .ok_or_else(|| cfg_err(format!("{k} must be true or false"))),
    }
}

/// A processor setting that is a number, `d` when absent or null.
pub(crate) fn json_float(o: &JsonMap, k: &str, d: f64) -> Result<f64> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(d),
        Some(x) => x
            .as_f64()
            .ok_or_else(|| cfg_err(format!("{k} must be a number"))),
    }
}

/// A per-channel processor setting (a number or 3), `d` when absent or null.
pub(crate) fn json_triple(o: &JsonMap, k: &str, d: [f32; 3]) -> Result<[f32; 3]> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(d),
        Some(Value::Number(n)) => Ok([n.as_f64().unwrap_or(f64::NAN) as f32; 3]),
        Some(Value::Array(a)) if a.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, x) in out.iter_mut().zip(a) {
                *o = x
                    .as_f64()
                    .ok_or_else(|| cfg_err(format!("{k} must hold numbers")))?
                    as f32;
            }
            Ok(out)
        }
        Some(_) => Err(cfg_err(format!("{k} must be a number or 3 numbers"))),
    }
}

impl ProcessorConfig {
    /// Read `preprocessor_config.json` or `processor_config.json` (which nests the image
    /// processor under `"image_processor"`); fields not given keep their defaults.
    pub fn from_json(v: &Value) -> Result<ProcessorConfig> {
        let top = v.as_object().ok_or_else(|| cfg_err("not a JSON object"))?;
        let ip = match top.get("image_processor") {
            Some(Value::Object(o)) => o,
            _ => top,
        };
        let mut c = ProcessorConfig::default();
        let uint = |k: &str, d: usize| json_uint(ip, k, d);
        let boolean = json_bool;
        let float = |k: &str, d: f64| json_float(ip, k, d);
        let triple = |k: &str, d: [f32; 3]| json_triple(ip, k, d);
        c.downsample_factor = uint("downsample_factor", c.downsample_factor)?;
        c.do_image_splitting = boolean(ip, "do_image_splitting", c.do_image_splitting)?;
        c.min_tiles = uint("min_tiles", c.min_tiles)?;
        c.max_tiles = uint("max_tiles", c.max_tiles)?;
        c.use_thumbnail = boolean(ip, "use_thumbnail", c.use_thumbnail)?;
        c.min_image_tokens = uint("min_image_tokens", c.min_image_tokens)?;
        c.max_image_tokens = uint("max_image_tokens", c.max_image_tokens)?;
        c.encoder_patch_size = uint("encoder_patch_size", c.encoder_patch_size)?;
        c.tile_size = uint("tile_size", c.tile_size)?;
        c.max_pixels_tolerance = float("max_pixels_tolerance", c.max_pixels_tolerance)?;
        c.do_rescale = boolean(ip, "do_rescale", c.do_rescale)?;
        c.rescale_factor = float("rescale_factor", c.rescale_factor)?;
        c.do_normalize = boolean(ip, "do_normalize", c.do_normalize)?;
        c.image_mean = triple("image_mean", c.image_mean)?;
        c.image_std = triple("image_std", c.image_std)?;
        // A processor-level setting; accept it beside the image processor's fields too.
        c.use_image_special_tokens = boolean(
            top,
            "use_image_special_tokens",
            boolean(ip, "use_image_special_tokens", c.use_image_special_tokens)?,
        )?;
        // Only bilinear (PIL's BILINEAR = 2, the class default) is implemented.
        match ip.get("resample") {
            None | Some(Value::Null) => {}
            Some(x) if x.as_u64() == Some(2) => {}
            Some(x) => {
                return Err(Error::Unsupported(format!(
                    "image processor resample {x}: only bilinear (2) is implemented"
                )))
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Check the settings are ones transformers accepts and that fit our integer arithmetic.
    pub fn validate(&self) -> Result<()> {
        let p = self.encoder_patch_size;
        if !(1..=1024).contains(&p) {
            return Err(cfg_err("encoder_patch_size must be 1..=1024"));
        }
        if !(1..=64).contains(&self.downsample_factor) {
            return Err(cfg_err("downsample_factor must be 1..=64"));
        }
        if self.tile_size < p || self.tile_size > 16384 || !self.tile_size.is_multiple_of(p) {
            return Err(cfg_err(
                "tile_size must be a multiple of encoder_patch_size, at most 16384",
            ));
        }
        if !(1..=1 << 20).contains(&self.max_image_tokens) || self.min_image_tokens > 1 << 20 {
            return Err(cfg_err(
                "max_image_tokens must be 1..=2^20 and min_image_tokens at most 2^20",
            ));
        }
        if self.do_image_splitting && self.min_tiles > self.max_tiles {
            return Err(cfg_err("min_tiles must be less than or equal to max_tiles"));
        }
        if self.max_tiles > MAX_TILES_LIMIT {
            return Err(cfg_err(format!(
                "max_tiles must be at most {MAX_TILES_LIMIT}"
            )));
        }
        // The grid image and the single-tile image must stay a sane size (≤ 2^28 pixels).
        let grid_pixels = (self.tile_size * self.tile_size) as u128 * self.max_tiles as u128;
        let single_pixels =
            self.max_image_tokens as u128 * ((p * self.downsample_factor) as u128).pow(2);
        if grid_pixels > 1 << 28 || single_pixels > 1 << 28 {
            return Err(cfg_err(
                "tile_size² · max_tiles and max_image_tokens · (patch · downsample)² must be at most 2^28 pixels",
            ));
        }
        if !self.max_pixels_tolerance.is_finite() || self.max_pixels_tolerance < 0.0 {
            return Err(cfg_err("max_pixels_tolerance must be a finite number >= 0"));
        }
        if self.do_rescale && !(self.rescale_factor.is_finite() && self.rescale_factor != 0.0) {
            return Err(cfg_err("rescale_factor must be a finite non-zero number"));
        }
        if self.do_normalize
            && (self.image_std.iter().any(|&s| s == 0.0 || !s.is_finite())
                || self.image_mean.iter().any(|m| !m.is_finite()))
        {
            return Err(cfg_err(
                "image_std must be non-zero and image_mean/std finite",
            ));
        }
        Ok(())
    }
}

/// An 8-bit RGB image, row-major, channels interleaved (HWC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

impl Rgb8 {
    /// An error unless the image has pixels and `width · height · 3` bytes (its fields are
    /// public: one made by hand may not).
    pub fn check(&self) -> Result<()> {
        if self.width == 0
            || self.height == 0
            || self
                .width
                .checked_mul(self.height)
                .and_then(|n| n.checked_mul(3))
                != Some(self.data.len())
        {
            return Err(Error::Input(format!(
                "image of {}x{} pixels with {} bytes of RGB data",
                self.width,
                self.height,
                self.data.len()
            )));
        }
        Ok(())
    }

    /// An image from its parts; `data` must hold `width * height * 3` bytes.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Result<Rgb8> {
        if width == 0
            || height == 0
            || width.checked_mul(height).and_then(|n| n.checked_mul(3)) != Some(data.len())
        {
            return Err(Error::Input(format!(
                "image of {width}x{height} pixels needs {} RGB bytes, got {}",
                width.saturating_mul(height).saturating_mul(3),
                data.len()
            )));
        }
        Ok(Rgb8 {
            width,
            height,
            data,
        })
    }
}

fn image_err(e: ImageError) -> Error {
    match e {
        ImageError::Limits(e) => Error::Input(format!("image too large to decode: {e}")),
        ImageError::Unsupported(e) => Error::Input(format!("unsupported image: {e}")),
        ImageError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::Input("truncated image data".into())
        }
        e => Error::Input(format!("cannot decode image: {e}")),
    }
}

/// Decode PNG, JPEG, WebP or GIF (its first frame) bytes into upright 8-bit RGB.
///
/// The size in the header is checked against `max_pixels` before any pixel is decoded (a
/// small file can declare a huge image). The EXIF orientation is applied. Alpha is dropped,
/// not composited (PIL's `convert("RGB")`: a transparent pixel keeps its stored colour; a
/// GIF's transparent index its palette colour); grey is replicated into the three channels.
/// 16-bit samples keep their high byte (PIL's `RGB;16B` for 16-bit colour PNGs; for 16-bit
/// grey PIL clips at 255 and torchvision returns uint16, neither of which is meaningful).
/// `max_pixels` also bounds the memory (at most 16 bytes a pixel, 64 MiB at least).
///
/// PNG, GIF and WebP (lossless, and lossy on every image tried) decode to PIL's bytes; JPEG
/// does not: zune-jpeg and libjpeg-turbo round the IDCT and chroma upsampling differently
/// (measured max |Δ| 4, mean under 0.5, but up to 36 in the last column of a
/// chroma-subsampled image whose width is not a multiple of the MCU). A GIF whose first
/// frame is smaller than its canvas is black outside the frame here (not checked against PIL).
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<Rgb8> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| Error::Input(format!("cannot read image: {e}")))?;
    if reader.format().is_none() {
        return Err(Error::Input(
            "not an image: expected PNG, JPEG, WebP or GIF data".into(),
        ));
    }
    let mut limits = Limits::default();
    // The decoded buffer (up to 8 bytes a pixel) plus the decoders' working memory.
    limits.max_alloc = Some(max_pixels.saturating_mul(16).max(64 << 20));
    reader.limits(limits);
    let mut decoder = reader.into_decoder().map_err(image_err)?;
    let (w, h) = decoder.dimensions();
    if w == 0 || h == 0 {
        return Err(Error::Input(format!("image has no pixels ({w}x{h})")));
    }
    if u64::from(w) * u64::from(h) > max_pixels {
        return Err(Error::Input(format!(
            "image of {w}x{h} pixels is over the limit of {max_pixels} pixels"
        )));
    }
    // A malformed EXIF block is ignored, as PIL ignores what it cannot parse.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(image_err)?;
    img.apply_orientation(orientation);
    Ok(to_rgb8(img))
}

fn to_rgb8(img: DynamicImage) -> Rgb8 {
    let (width, height) = (img.width() as usize, img.height() as usize);
    let data: Vec<u8> = match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageRgba8(b) => b.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect(),
        DynamicImage::ImageLuma8(b) => b.iter().flat_map(|&v| [v; 3]).collect(),
        DynamicImage::ImageLumaA8(b) => b.chunks_exact(2).flat_map(|p| [p[0]; 3]).collect(),
        DynamicImage::ImageRgb16(b) => b.iter().map(|&v| (v >> 8) as u8).collect(),
        DynamicImage::ImageRgba16(b) => b
            .chunks_exact(4)
            .flat_map(|p| [(p[0] >> 8) as u8, (p[1] >> 8) as u8, (p[2] >> 8) as u8])
            .collect(),
        DynamicImage::ImageLuma16(b) => b.iter().flat_map(|&v| [(v >> 8) as u8; 3]).collect(),
        DynamicImage::ImageLumaA16(b) => b
            .chunks_exact(2)
            .flat_map(|p| [(p[0] >> 8) as u8; 3])
            .collect(),
        other => other.to_rgb8().into_raw(),
    };
    Rgb8 {
        width,
        height,
        data,
    }
}

// ---------------------------------------------------------------------------------------------
// Resize: torch's uint8 antialias kernels (bilinear and bicubic).

/// The interpolation of a resize: torch's `aa_filter`s, Pillow's too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// The triangle filter (`interp_size` 2).
    Bilinear,
    /// Keys' cubic convolution with a = −0.5 (`interp_size` 4).
    Bicubic,
}

impl Filter {
    /// Half the filter's width in source pixels at scale 1.
    fn half_width(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// One axis of torch's separable resample: for each output index the first input index, the
/// number of taps and their int16 weights, all with `precision` fractional bits.
struct AxisWeights {
    bounds: Vec<(usize, usize)>,
    /// `[out, ksize]`, zero past each row's tap count.
    weights: Vec<i32>,
    ksize: usize,
    precision: u32,
}

/// torch's `_compute_indices_int16_weights_aa` (`align_corners` false, no explicit scale):
/// f64 weights as Pillow's `precompute_coeffs`, normalized per output, then scaled to int16
/// with as many fractional bits as the largest weight allows (`(int)(0.5 + w·2^p) < 2^15`
/// for `p + 1`, at most 22), negative weights rounded away from zero.
fn axis_weights(input: usize, output: usize, filter: Filter) -> AxisWeights {
    let scale = input as f64 / output as f64;
    let hw = filter.half_width();
    let (support, invscale) = if scale >= 1.0 {
        (hw * scale, 1.0 / scale)
    } else {
        (hw, 1.0)
    };
    let ksize = support.ceil() as usize * 2 + 1;
    let mut wf = vec![0f64; output * ksize];
    let mut bounds = Vec::with_capacity(output);
    for (i, row) in wf.chunks_exact_mut(ksize).enumerate() {
        let center = scale * (i as f64 + 0.5);
        // C's float → int64 conversion truncates toward zero.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(input as i64) as usize;
        let n = xmax.saturating_sub(xmin).min(ksize);
        let mut total = 0f64;
        for (j, w) in row[..n].iter_mut().enumerate() {
            *w = filter.weight(((j + xmin) as f64 - center + 0.5) * invscale);
            total += *w;
        }
        if total != 0.0 {
            row[..n].iter_mut().for_each(|w| *w /= total);
        }
        bounds.push((xmin, n));
    }
    let w_max = wf.iter().copied().fold(wf[0], f64::max);
    let mut precision = 0u32;
    while precision < 22 {
        if (0.5 + w_max * f64::from(1u32 << (precision + 1))) as i32 >= 1 << 15 {
            break;
        }
        precision += 1;
    }
    let scale_p = f64::from(1u32 << precision);
    let weights = wf
        .iter()
        .map(|&v| {
            if v < 0.0 {
                (-0.5 + v * scale_p) as i32
            } else {
                (0.5 + v * scale_p) as i32
            }
        })
        .collect();
    AxisWeights {
        bounds,
        weights,
        ksize,
        precision,
    }
}

/// `(1 << (p − 1) + Σ pixel·weight) >> p`, saturated to a byte (the AVX kernels' `packs` then
/// `packus`; the scalar ones' clamp).
#[inline]
fn fixed_to_u8(acc: i32, precision: u32) -> u8 {
    (acc >> precision).clamp(0, 255) as u8
}

fn resize_horizontal(src: &[u8], h: usize, w: usize, out_w: usize, filter: Filter) -> Vec<u8> {
    let aw = axis_weights(w, out_w, filter);
    let half = if aw.precision > 0 {
        1i32 << (aw.precision - 1)
    } else {
        0
    };
    let mut out = vec![0u8; h * out_w * 3];
    for (src_row, out_row) in src.chunks_exact(w * 3).zip(out.chunks_exact_mut(out_w * 3)) {
        for (x, px) in out_row.chunks_exact_mut(3).enumerate() {
            let (xmin, n) = aw.bounds[x];
            let k = &aw.weights[x * aw.ksize..x * aw.ksize + n];
            let taps = &src_row[xmin * 3..(xmin + n) * 3];
            let mut acc = [half; 3];
            for (t, &wt) in taps.chunks_exact(3).zip(k) {
                acc[0] += i32::from(t[0]) * wt;
                acc[1] += i32::from(t[1]) * wt;
                acc[2] += i32::from(t[2]) * wt;
            }
            for c in 0..3 {
                px[c] = fixed_to_u8(acc[c], aw.precision);
            }
        }
    }
    out
}

fn resize_vertical(src: &[u8], h: usize, w: usize, out_h: usize, filter: Filter) -> Vec<u8> {
    let aw = axis_weights(h, out_h, filter);
    let half = if aw.precision > 0 {
        1i32 << (aw.precision - 1)
    } else {
        0
    };
    let stride = w * 3;
    let mut out = vec![0u8; out_h * stride];
    let mut acc = vec![0i32; stride];
    for (y, out_row) in out.chunks_exact_mut(stride).enumerate() {
        let (ymin, n) = aw.bounds[y];
        let k = &aw.weights[y * aw.ksize..y * aw.ksize + n];
        acc.fill(half);
        for (j, &wt) in k.iter().enumerate() {
            let row = &src[(ymin + j) * stride..(ymin + j + 1) * stride];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += i32::from(v) * wt;
            }
        }
        for (o, &a) in out_row.iter_mut().zip(&acc) {
            *o = fixed_to_u8(a, aw.precision);
        }
    }
    out
}

/// torchvision's `resize(uint8 CHW, [out_h, out_w], BILINEAR, antialias=True)` on CPU, which
/// is torch's `interpolate(mode="bilinear", align_corners=False, antialias=True)` uint8
/// kernel (`UpSampleKernel.cpp`, `UpSampleKernelAVXAntialias.h`): a horizontal pass then a
/// vertical one, each skipped when that size does not change, each in int32 fixed point
/// over int16 weights and rounded to bytes in between. Byte-identical to torch on x86 with
/// AVX2/AVX-512 and on aarch64; on x86 without AVX2 torchvision resizes in f32 instead.
pub fn resize_bilinear_aa(src: &Rgb8, out_h: usize, out_w: usize) -> Rgb8 {
    resize_aa(src, out_h, out_w, Filter::Bilinear)
}

/// torch's uint8 antialiased resize with `filter` ([`resize_bilinear_aa`]). torchvision hands
/// uint8 images to torch's kernel for `BICUBIC` on every CPU; on x86 with AVX2 (the
/// references') that is this fixed-point kernel.
pub fn resize_aa(src: &Rgb8, out_h: usize, out_w: usize, filter: Filter) -> Rgb8 {
    let (h, w) = (src.height, src.width);
    if (h, w) == (out_h, out_w) {
        return src.clone();
    }
    let mut data = src.data.clone();
    if w != out_w {
        data = resize_horizontal(&data, h, w, out_w, filter);
    }
    if h != out_h {
        data = resize_vertical(&data, h, out_w, out_h, filter);
    }
    Rgb8 {
        width: out_w,
        height: out_h,
        data,
    }
}

// ---------------------------------------------------------------------------------------------
// Sizes and the tiling grid.

/// Python's `round(x / f) * f` (round half to even).
fn round_by_factor(x: usize, f: usize) -> usize {
    (x as f64 / f as f64).round_ties_even() as usize * f
}

/// `smart_resize`: the single-tile (or thumbnail) size, `(height, width)`, both multiples of
/// `encoder_patch_size · downsample_factor`, the pixel count within the token limits.
pub fn smart_resize(height: usize, width: usize, cfg: &ProcessorConfig) -> (usize, usize) {
    let tf = cfg.encoder_patch_size * cfg.downsample_factor;
    let per_token = (cfg.encoder_patch_size * cfg.downsample_factor).pow(2);
    let min_pixels = cfg.min_image_tokens * per_token;
    let max_pixels = cfg.max_image_tokens * per_token;
    let mut h_bar = tf.max(round_by_factor(height, tf));
    let mut w_bar = tf.max(round_by_factor(width, tf));
    let (hf, wf, tff) = (height as f64, width as f64, tf as f64);
    if (h_bar as u128) * (w_bar as u128) > max_pixels as u128 {
        let beta = ((hf * wf) / max_pixels as f64).sqrt();
        h_bar = tf.max((hf / beta / tff).floor() as usize * tf);
        w_bar = tf.max((wf / beta / tff).floor() as usize * tf);
    } else if (h_bar as u128) * (w_bar as u128) < min_pixels as u128 {
        let beta = (min_pixels as f64 / (hf * wf)).sqrt();
        h_bar = (hf * beta / tff).ceil() as usize * tf;
        w_bar = (wf * beta / tff).ceil() as usize * tf;
    }
    (h_bar, w_bar)
}

/// `_is_image_too_large`: whether the image is split into tiles (when splitting is on).
pub fn is_image_too_large(height: usize, width: usize, cfg: &ProcessorConfig) -> bool {
    let p = cfg.encoder_patch_size;
    let tf = p * cfg.downsample_factor;
    let h_bar = p.max(round_by_factor(height, tf));
    let w_bar = p.max(round_by_factor(width, tf));
    let limit = (cfg.max_image_tokens * (p * p) * cfg.downsample_factor.pow(2)) as f64
        * cfg.max_pixels_tolerance;
    (h_bar as f64 * w_bar as f64) > limit
}

/// CPython's `hash((a, b))` for two small non-negative ints (tuplehash, xxHash-based, 64-bit).
fn py_hash_pair(a: usize, b: usize) -> u64 {
    const P1: u64 = 11400714785074694791;
    const P2: u64 = 14029467366897019727;
    const P5: u64 = 2870177450012600261;
    let mut acc = P5;
    for lane in [a as u64, b as u64] {
        acc = acc.wrapping_add(lane.wrapping_mul(P2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(P1);
    }
    acc = acc.wrapping_add(2 ^ (P5 ^ 3527539));
    if acc == u64::MAX {
        1546275796
    } else {
        acc
    }
}

/// The iteration order of a CPython (3.8–3.13) `set` built by adding `keys` in order
/// (`Objects/setobject.c`: open addressing, 9 linear probes then perturbed probing, resized ×4
/// when 60 % full). `sorted(set(...), key=...)` keeps this order among equal keys.
fn py_set_order(keys: &[(usize, usize)]) -> Vec<(usize, usize)> {
    type Slot = Option<(u64, (usize, usize))>;
    const LINEAR_PROBES: usize = 9;
    // The slot a key lands in (`set_add_entry` / `set_insert_clean` probe the same way);
    // `None` when an equal key is already there.
    fn find(table: &[Slot], hash: u64, key: (usize, usize)) -> Option<usize> {
        let mask = table.len() - 1;
        let mut perturb = hash;
        let mut i = (hash as usize) & mask;
        loop {
            let probes = if i + LINEAR_PROBES <= mask {
                LINEAR_PROBES
            } else {
                0
            };
            for (j, slot) in table.iter().enumerate().skip(i).take(probes + 1) {
                match *slot {
                    None => return Some(j),
                    Some((h, k)) if h == hash && k == key => return None,
                    _ => {}
                }
            }
            perturb >>= 5;
            i = (i
                .wrapping_mul(5)
                .wrapping_add(1)
                .wrapping_add(perturb as usize))
                & mask;
        }
    }
    let mut table: Vec<Slot> = vec![None; 8];
    let mut used = 0usize;
    for &key in keys {
        let hash = py_hash_pair(key.0, key.1);
        let Some(slot) = find(&table, hash, key) else {
            continue;
        };
        table[slot] = Some((hash, key));
        used += 1;
        let mask = table.len() - 1;
        if used * 5 >= mask * 3 {
            let mut size = 8;
            while size <= used * 4 {
                size <<= 1;
            }
            let old = std::mem::replace(&mut table, vec![None; size]);
            for (h, k) in old.into_iter().flatten() {
                let s = find(&table, h, k).expect("keys are distinct");
                table[s] = Some((h, k));
            }
        }
    }
    table.into_iter().flatten().map(|(_, k)| k).collect()
}

/// `_target_ratios(min_tiles, max_tiles)`: every `(w, h)` grid with `min ≤ w·h ≤ max`, in the
/// order transformers iterates them (`sorted(set(list), key=area)`: by area, ties in CPython's
/// set order, which decides `find_closest_aspect_ratio`'s ties).
pub fn target_ratios(min_tiles: usize, max_tiles: usize) -> Vec<(usize, usize)> {
    // The list comprehension's first occurrences, in order: `(w, h)` first appears at
    // `n = max(w, h, min_tiles)` (the loops are `for n, for w in 1..=n, for h in 1..=n`).
    let ok = |w: usize, h: usize| (min_tiles..=max_tiles).contains(&(w * h));
    let mut list = Vec::new();
    for n in min_tiles.max(1)..=max_tiles {
        for w in 1..=n {
            for h in 1..=n {
                let new = n == min_tiles.max(1) || w == n || h == n;
                if new && ok(w, h) {
                    list.push((w, h));
                }
            }
        }
    }
    let mut ratios = py_set_order(&list);
    ratios.sort_by_key(|&(w, h)| w * h);
    ratios
}

/// `_get_grid_layout` / `find_closest_aspect_ratio`: the `(cols, rows)` grid for an image.
pub fn grid_layout(
    height: usize,
    width: usize,
    min_tiles: usize,
    max_tiles: usize,
    tile_size: usize,
) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let area = (width as f64) * (height as f64);
    let mut best_diff = f64::INFINITY;
    let mut best = (1, 1);
    for (w, h) in target_ratios(min_tiles, max_tiles) {
        let diff = (aspect - w as f64 / h as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (w, h);
        } else if diff == best_diff {
            let target_area = (tile_size * tile_size * w * h) as f64;
            if area > 0.5 * target_area {
                best = (w, h);
            }
        }
    }
    best
}

// ---------------------------------------------------------------------------------------------
// Normalization, patches, the whole processor.

/// The f32 value each byte becomes, per channel, with transformers' arithmetic: rescale and
/// normalize fused into `(x − mean·(1/rf)) / (std·(1/rf))`, the factors f32 products
/// (`torch.tensor(mean) * (1.0 / rescale_factor)`), the subtraction and division f32
/// (`tvF.normalize`); normalize alone `(x − mean) / std`; rescale alone `x · rf` in f32.
pub fn normalization_table(cfg: &ProcessorConfig) -> [[f32; 256]; 3] {
    Normalize {
        do_rescale: cfg.do_rescale,
        rescale_factor: cfg.rescale_factor,
        do_normalize: cfg.do_normalize,
        mean: cfg.image_mean,
        std: cfg.image_std,
    }
    .table()
}

/// The rescale and normalize settings of an image processor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalize {
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Normalize {
    /// The f32 value of each byte per channel ([`normalization_table`]).
    pub fn table(&self) -> [[f32; 256]; 3] {
        let mut t = [[0f32; 256]; 3];
        for (c, tc) in t.iter_mut().enumerate() {
            let (mean, std) = if self.do_rescale {
                let inv = (1.0 / self.rescale_factor) as f32;
                (self.mean[c] * inv, self.std[c] * inv)
            } else {
                (self.mean[c], self.std[c])
            };
            for (v, o) in tc.iter_mut().enumerate() {
                let x = v as f32;
                *o = if self.do_normalize {
                    (x - mean) / std
                } else if self.do_rescale {
                    x * self.rescale_factor as f32
                } else {
                    x
                };
            }
        }
        t
    }
}

/// One tile (or the thumbnail, or the single resized image) as the encoder's input.
#[derive(Clone, Debug, PartialEq)]
pub struct Tile {
    pub h_patches: usize,
    pub w_patches: usize,
    /// `[h_patches·w_patches, 3·p·p]`: patches row-major, each flattened in (y, x, channel)
    /// order (`convert_image_to_patches`); no padding.
    pub pixels: Vec<f32>,
}

fn to_tile(img: &Rgb8, p: usize, table: &[[f32; 256]; 3]) -> Tile {
    let (hp, wp) = (img.height / p, img.width / p);
    let patch_len = 3 * p * p;
    let mut pixels = Vec::with_capacity(hp * wp * patch_len);
    for py in 0..hp {
        for px in 0..wp {
            for y in 0..p {
                let row = (py * p + y) * img.width * 3 + px * p * 3;
                for (i, &v) in img.data[row..row + p * 3].iter().enumerate() {
                    pixels.push(table[i % 3][v as usize]);
                }
            }
        }
    }
    Tile {
        h_patches: hp,
        w_patches: wp,
        pixels,
    }
}

/// One image's encoder inputs and its place in the prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Processed {
    /// The grid's tiles row by row, then the thumbnail if there is one; or the single image.
    pub tiles: Vec<Tile>,
    pub rows: usize,
    pub cols: usize,
    /// Whether the last tile is a thumbnail (a grid of more than one tile and `use_thumbnail`).
    pub thumbnail: bool,
    /// The `smart_resize` size `(height, width)` (transformers' `image_sizes`).
    pub image_size: (usize, usize),
    /// `<image>` tokens per grid tile: `ceil(tile_size / p / downsample)²`.
    pub tokens_per_tile: usize,
    /// `<image>` tokens for the single image or the thumbnail, from `image_size`.
    pub tokens_for_image: usize,
}

/// transformers' `Lfm2VlImageProcessor` on one image (`return_row_col_info=True`), without
/// the padding to `max_num_patches`.
pub fn preprocess(img: &Rgb8, cfg: &ProcessorConfig) -> Result<Processed> {
    cfg.validate()?;
    img.check()?;
    let (min_tiles, max_tiles) = if cfg.do_image_splitting {
        (cfg.min_tiles, cfg.max_tiles)
    } else {
        (1, 1)
    };
    let splitting = !(min_tiles == 1 && max_tiles == 1);
    let (h, w) = (img.height, img.width);
    let large = is_image_too_large(h, w, cfg);
    let (new_h, new_w) = smart_resize(h, w, cfg);
    let p = cfg.encoder_patch_size;
    let table = normalization_table(cfg);
    let mut tiles = Vec::new();
    let (mut rows, mut cols, mut thumbnail) = (1, 1, false);
    if large && splitting {
        let t = cfg.tile_size;
        (cols, rows) = grid_layout(h, w, min_tiles, max_tiles, t);
        let resized = resize_bilinear_aa(img, t * rows, t * cols);
        let mut tile = Rgb8 {
            width: t,
            height: t,
            data: vec![0; t * t * 3],
        };
        for r in 0..rows {
            for c in 0..cols {
                for y in 0..t {
                    let src = ((r * t + y) * resized.width + c * t) * 3;
                    tile.data[y * t * 3..(y + 1) * t * 3]
                        .copy_from_slice(&resized.data[src..src + t * 3]);
                }
                tiles.push(to_tile(&tile, p, &table));
            }
        }
        if cfg.use_thumbnail && rows * cols != 1 {
            thumbnail = true;
            tiles.push(to_tile(&resize_bilinear_aa(img, new_h, new_w), p, &table));
        }
    } else {
        tiles.push(to_tile(&resize_bilinear_aa(img, new_h, new_w), p, &table));
    }
    let d = cfg.downsample_factor;
    let per_side = (cfg.tile_size / p).div_ceil(d);
    Ok(Processed {
        tiles,
        rows,
        cols,
        thumbnail,
        image_size: (new_h, new_w),
        tokens_per_tile: per_side * per_side,
        tokens_for_image: (new_h / p).div_ceil(d) * (new_w / p).div_ceil(d),
    })
}

const IMAGE_TOKEN: &str = "<image>";

impl Processed {
    /// `Lfm2VlProcessor._build_image_tokens`: the text that replaces one `<image>` in the
    /// prompt. A grid: `<|image_start|>`, per tile `<|img_row_R_col_C|>` and
    /// `tokens_per_tile` `<image>`, then `<|img_thumbnail|>` and `tokens_for_image` `<image>`
    /// (with `use_thumbnail`), `<|image_end|>`; one tile: start, `tokens_for_image` `<image>`,
    /// end. Without `use_image_special_tokens` only the `<image>` runs remain.
    ///
    /// As transformers, the single-tile count comes from `image_size` even when a grid of one
    /// tile (`min_tiles` 1) holds a `tile_size` tile.
    pub fn placeholder(&self, cfg: &ProcessorConfig) -> String {
        let special = cfg.use_image_special_tokens;
        let mut s = String::with_capacity(self.n_image_tokens() * IMAGE_TOKEN.len() + 64);
        if special {
            s.push_str("<|image_start|>");
        }
        if self.rows > 1 || self.cols > 1 {
            for r in 0..self.rows {
                for c in 0..self.cols {
                    if special {
                        s.push_str(&format!("<|img_row_{}_col_{}|>", r + 1, c + 1));
                    }
                    s.push_str(&IMAGE_TOKEN.repeat(self.tokens_per_tile));
                }
            }
            if self.thumbnail {
                if special {
                    s.push_str("<|img_thumbnail|>");
                }
                s.push_str(&IMAGE_TOKEN.repeat(self.tokens_for_image));
            }
        } else {
            s.push_str(&IMAGE_TOKEN.repeat(self.tokens_for_image));
        }
        if special {
            s.push_str("<|image_end|>");
        }
        s
    }

    /// The number of `<image>` tokens in [`Processed::placeholder`].
    pub fn n_image_tokens(&self) -> usize {
        if self.rows > 1 || self.cols > 1 {
            self.rows * self.cols * self.tokens_per_tile
                + if self.thumbnail {
                    self.tokens_for_image
                } else {
                    0
                }
        } else {
            self.tokens_for_image
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against transformers 5.24 / torchvision / PIL, from
    //! `tests/reference/vision/gen_image_refs.py` (files in `tests/reference/vision/images/`).

    use super::*;
    use sha2::{Digest, Sha256};
    use std::path::PathBuf;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/vision/images")
    }

    fn refs() -> Value {
        let text = std::fs::read_to_string(dir().join("refs.json")).expect("refs.json");
        serde_json::from_str(&text).expect("refs.json parses")
    }

    fn file(name: &str) -> Vec<u8> {
        std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn sha_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn hex_f32(s: &str) -> Vec<f32> {
        (0..s.len() / 8)
            .map(|i| {
                let b: Vec<u8> = (0..4)
                    .map(|j| u8::from_str_radix(&s[i * 8 + j * 2..i * 8 + j * 2 + 2], 16).unwrap())
                    .collect();
                f32::from_le_bytes(b.try_into().unwrap())
            })
            .collect()
    }

    /// The generator's `noise`: byte i is the top byte of splitmix64(seed << 32 | i).
    fn noise(h: usize, w: usize, seed: u64) -> Vec<u8> {
        (0..(h * w * 3) as u64)
            .map(|i| {
                let mut z = ((seed << 32) + i).wrapping_add(0x9E3779B97F4A7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
                z ^= z >> 31;
                let b = (z >> 56) as u8;
                match seed % 2 {
                    1 if b >= 128 => 255,
                    1 => 0,
                    _ => b,
                }
            })
            .collect()
    }

    /// The generator's `synthetic`: sawtooth ramps plus `noise % 7 − 3`.
    fn synthetic(h: usize, w: usize, seed: u64) -> Rgb8 {
        let nz = noise(h, w, seed);
        let mut data = Vec::with_capacity(h * w * 3);
        for y in 0..h {
            for x in 0..w {
                let p = [
                    (3 * x + 5 * y) % 256,
                    (7 * x + 2 * y + 40) % 256,
                    (x * y / 7 + 100) % 256,
                ];
                for (c, v) in p.into_iter().enumerate() {
                    let n = i64::from(nz[(y * w + x) * 3 + c] % 7) - 3;
                    data.push((v as i64 + n).clamp(0, 255) as u8);
                }
            }
        }
        Rgb8::new(w, h, data).unwrap()
    }

    fn usize_of(v: &Value) -> usize {
        v.as_u64().unwrap() as usize
    }

    #[test]
    fn resize_matches_torchvision_bytes() {
        check_resizes("resize", Filter::Bilinear);
    }

    #[test]
    fn bicubic_resize_matches_torchvision_bytes() {
        check_resizes("resize_bicubic", Filter::Bicubic);
    }

    fn check_resizes(key: &str, filter: Filter) {
        let r = refs();
        let cases = r[key].as_array().unwrap();
        assert!(cases.len() > 100);
        for c in cases {
            let c = c.as_array().unwrap();
            let (h, w, oh, ow) = (
                usize_of(&c[0]),
                usize_of(&c[1]),
                usize_of(&c[2]),
                usize_of(&c[3]),
            );
            let src = Rgb8::new(w, h, noise(h, w, c[4].as_u64().unwrap())).unwrap();
            let out = resize_aa(&src, oh, ow, filter);
            assert_eq!((out.height, out.width), (oh, ow));
            if let Some(hex) = c.get(6) {
                let want: Vec<u8> = (0..hex.as_str().unwrap().len() / 2)
                    .map(|i| {
                        u8::from_str_radix(&hex.as_str().unwrap()[2 * i..2 * i + 2], 16).unwrap()
                    })
                    .collect();
                assert_eq!(out.data, want, "{key} {h}x{w} -> {oh}x{ow}");
            }
            assert_eq!(
                &sha_hex(&out.data)[..32],
                c[5].as_str().unwrap(),
                "{key} {h}x{w} -> {oh}x{ow} differs from torchvision"
            );
        }
    }

    #[test]
    fn normalization_matches_transformers_bits() {
        let r = refs();
        for n in r["normalize"].as_array().unwrap() {
            let cfg = ProcessorConfig::from_json(&n["config"]).unwrap();
            let t = normalization_table(&cfg);
            let flat: Vec<f32> = t.iter().flatten().copied().collect();
            if let Some(hex) = n.get("f32_hex") {
                let want = hex_f32(hex.as_str().unwrap());
                for (i, (a, b)) in flat.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{}: channel {} value {}: {a} vs {b}",
                        n["config"],
                        i / 256,
                        i % 256
                    );
                }
            }
            assert_eq!(
                sha_hex(&f32_bytes(&flat)),
                n["sha256"].as_str().unwrap(),
                "{}",
                n["config"]
            );
        }
    }

    #[test]
    fn target_ratios_follow_python_set_order() {
        let r = refs();
        for t in r["target_ratios"].as_array().unwrap() {
            let (mn, mx) = (usize_of(&t["min"]), usize_of(&t["max"]));
            let got: Vec<String> = target_ratios(mn, mx)
                .iter()
                .map(|(w, h)| format!("{w}x{h}"))
                .collect();
            assert_eq!(
                got.join(" "),
                t["ratios"].as_str().unwrap(),
                "_target_ratios({mn}, {mx})"
            );
        }
    }

    #[test]
    fn grid_layout_matches_including_ties() {
        let r = refs();
        let grid = r["grid"].as_array().unwrap();
        assert!(grid.len() > 200);
        for g in grid {
            let g: Vec<usize> = g.as_array().unwrap().iter().map(usize_of).collect();
            assert_eq!(
                grid_layout(g[0], g[1], g[2], g[3], g[4]),
                (g[5], g[6]),
                "_get_grid_layout(h={}, w={}, min={}, max={}, tile={})",
                g[0],
                g[1],
                g[2],
                g[3],
                g[4]
            );
        }
    }

    #[test]
    fn sizes_match_smart_resize_and_too_large() {
        let r = refs();
        for s in r["sizes"].as_array().unwrap() {
            let cfg = ProcessorConfig::from_json(&s["config"]).unwrap();
            for row in s["rows"].as_array().unwrap() {
                let v: Vec<usize> = row.as_array().unwrap().iter().map(usize_of).collect();
                assert_eq!(
                    smart_resize(v[0], v[1], &cfg),
                    (v[2], v[3]),
                    "smart_resize {v:?} {}",
                    s["config"]
                );
                assert_eq!(
                    is_image_too_large(v[0], v[1], &cfg),
                    v[4] == 1,
                    "too large {v:?} {}",
                    s["config"]
                );
            }
        }
    }

    /// The expanded text from the reference's run-length pairs.
    fn expand(rle: &Value) -> String {
        rle.as_array()
            .unwrap()
            .iter()
            .map(|p| p[0].as_str().unwrap().repeat(usize_of(&p[1])))
            .collect()
    }

    #[test]
    fn processor_matches_transformers() {
        let r = refs();
        let cases = r["cases"].as_array().unwrap();
        assert!(cases.len() >= 25);
        for case in cases {
            let img = match &case["image"] {
                Value::String(name) if name.ends_with(".jpg") => {
                    // JPEG decoders differ (see decode_matches_pil): start from PIL's pixels.
                    let d = &r["decode"][name.as_str()];
                    Rgb8::new(
                        usize_of(&d["width"]),
                        usize_of(&d["height"]),
                        file(&format!("{name}.pil.rgb")),
                    )
                    .unwrap()
                }
                Value::String(name) => decode(&file(name), 1 << 24).unwrap(),
                s => {
                    let s: Vec<usize> = s.as_array().unwrap().iter().map(usize_of).collect();
                    synthetic(s[0], s[1], s[2] as u64)
                }
            };
            let what = format!("{} {}", case["image"], case["config"]);
            let mut cfg = ProcessorConfig::from_json(&case["config"]).unwrap();
            cfg.use_image_special_tokens = case["use_image_special_tokens"].as_bool().unwrap();
            let p = preprocess(&img, &cfg).unwrap();
            assert_eq!(
                (p.rows, p.cols),
                (usize_of(&case["rows"]), usize_of(&case["cols"])),
                "{what}"
            );
            let size: Vec<usize> = case["image_size"]
                .as_array()
                .unwrap()
                .iter()
                .map(usize_of)
                .collect();
            assert_eq!(p.image_size, (size[0], size[1]), "{what}");
            let shapes = case["spatial_shapes"].as_array().unwrap();
            assert_eq!(p.tiles.len(), shapes.len(), "{what}");
            let q = 3 * cfg.encoder_patch_size * cfg.encoder_patch_size;
            for (i, t) in p.tiles.iter().enumerate() {
                let s: Vec<usize> = shapes[i].as_array().unwrap().iter().map(usize_of).collect();
                assert_eq!((t.h_patches, t.w_patches), (s[0], s[1]), "{what} tile {i}");
                assert_eq!(t.pixels.len(), s[0] * s[1] * q);
                let head = hex_f32(case["tiles_head"][i].as_str().unwrap());
                let head_bits: Vec<u32> = head.iter().map(|x| x.to_bits()).collect();
                let got_bits: Vec<u32> =
                    t.pixels[..head.len()].iter().map(|x| x.to_bits()).collect();
                assert_eq!(
                    got_bits,
                    head_bits,
                    "{what} tile {i}: first values {:?} vs {head:?}",
                    &t.pixels[..head.len()]
                );
                assert_eq!(
                    sha_hex(&f32_bytes(&t.pixels)),
                    case["tiles_sha256"][i].as_str().unwrap(),
                    "{what} tile {i}: pixel_values differ"
                );
            }
            let text = p.placeholder(&cfg);
            assert_eq!(text, expand(&case["placeholder_rle"]), "{what}");
            assert_eq!(
                p.n_image_tokens(),
                usize_of(&case["n_image_tokens"]),
                "{what}"
            );
            assert_eq!(text.matches("<image>").count(), p.n_image_tokens());
        }
    }

    #[test]
    fn decode_matches_pil() {
        let r = refs();
        for (name, d) in r["decode"].as_object().unwrap() {
            let img = decode(&file(name), 1 << 24).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                (img.width, img.height),
                (usize_of(&d["width"]), usize_of(&d["height"])),
                "{name}"
            );
            match name.as_str() {
                "exif6_64x48.jpg" => {
                    // zune-jpeg (the `image` crate) and libjpeg-turbo (PIL and torchvision)
                    // round the IDCT, chroma upsampling and YCbCr → RGB differently. Here max
                    // |Δ| 3, mean 0.39; over 30 JPEGs (4:4:4, 4:2:2, 4:2:0, progressive, grey,
                    // 17 to 300 pixels wide) max 4 and mean ≤ 0.41, except the last column of
                    // a subsampled image whose width is not a multiple of the MCU (up to 36).
                    // Lossy WebP (image-webp vs libwebp) was exact on all 20 tried.
                    let want = file(&format!("{name}.pil.rgb"));
                    assert_eq!(img.data.len(), want.len(), "{name}");
                    let diff: Vec<i32> = img
                        .data
                        .iter()
                        .zip(&want)
                        .map(|(&a, &b)| (i32::from(a) - i32::from(b)).abs())
                        .collect();
                    let max = *diff.iter().max().unwrap();
                    let mean = diff.iter().sum::<i32>() as f64 / diff.len() as f64;
                    assert!(max <= 3 && mean < 0.4, "{name}: max |Δ| {max}, mean {mean}");
                }
                "gray16_20x12.png" => {
                    // A deliberate difference: PIL clips 16-bit grey at 255; we keep the high byte.
                    assert_eq!(
                        sha_hex(&img.data),
                        d["sha256_high_byte"].as_str().unwrap(),
                        "{name}"
                    );
                }
                _ => assert_eq!(
                    sha_hex(&img.data),
                    d["sha256_pil"].as_str().unwrap(),
                    "{name}: differs from PIL"
                ),
            }
        }
    }

    fn png_chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        // CRC-32 (IEEE), bitwise.
        let mut crc = 0xFFFF_FFFFu32;
        for &b in kind.iter().chain(data) {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&(!crc).to_be_bytes());
        out
    }

    fn is_input_err(r: Result<Rgb8>) -> bool {
        matches!(r, Err(Error::Input(_)))
    }

    #[test]
    fn bad_bytes_are_input_errors() {
        for bytes in [
            &b""[..],
            b"not an image at all",
            b"\x89PNG\r\n\x1a\n",
            b"GIF89a",
            b"\xff\xd8\xff",
            b"RIFF\0\0\0\0WEBPVP8 ",
        ] {
            assert!(is_input_err(decode(bytes, 1 << 24)), "{bytes:?}");
        }
        // BMP is recognised by its signature but not compiled in.
        assert!(is_input_err(decode(
            b"BM\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            1 << 24
        )));
        // Truncated files: a PNG cut inside its data is an error; no cut panics.
        for name in [
            "rgb_37x50.png",
            "palette_41x29.gif",
            "exif6_64x48.jpg",
            "lossless_33x21.webp",
            "lossy_40x30.webp",
        ] {
            let b = file(name);
            for cut in [
                0,
                1,
                7,
                8,
                12,
                16,
                30,
                33,
                60,
                b.len() / 3,
                b.len() / 2,
                b.len() - 20,
                b.len() - 1,
            ] {
                let r = decode(&b[..cut.min(b.len())], 1 << 24);
                if name.ends_with(".png") && cut <= b.len() / 2 {
                    assert!(is_input_err(r), "{name} cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn huge_declared_sizes_are_refused_before_decoding() {
        // A PNG whose header declares 100000 × 100000 pixels and holds no data.
        let mut ihdr = 100_000u32.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&100_000u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(png_chunk(b"IHDR", &ihdr));
        png.extend(png_chunk(
            b"IDAT",
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        ));
        png.extend(png_chunk(b"IEND", b""));
        match decode(&png, 1 << 26) {
            Err(Error::Input(m)) => assert!(m.contains("over the limit"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A GIF declaring 65535 × 65535.
        let mut gif = b"GIF89a\xff\xff\xff\xff\x00\x00\x00".to_vec();
        gif.extend_from_slice(b"\x2c\x00\x00\x00\x00\xff\xff\xff\xff\x00\x02\x02\x44\x01\x00\x3b");
        assert!(is_input_err(decode(&gif, 1 << 26)));
        // A real image over a small limit.
        match decode(&file("rgb_37x50.png"), 37 * 50 - 1) {
            Err(Error::Input(m)) => assert!(m.contains("37x50"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(decode(&file("rgb_37x50.png"), 37 * 50).is_ok());
    }

    #[test]
    fn damaged_images_never_panic() {
        let cfg = ProcessorConfig::from_json(&serde_json::json!({
            "min_image_tokens": 4, "max_image_tokens": 16, "tile_size": 64, "min_tiles": 2, "max_tiles": 4
        }))
        .unwrap();
        let mut rng = crate::test_rng::Rng(0x5eed_1234_abcd_0001);
        let names = [
            "rgb_37x50.png",
            "rgba_33x21.png",
            "palette_41x29.gif",
            "exif6_64x48.jpg",
            "exif8_30x20.png",
            "lossless_33x21.webp",
            "lossy_40x30.webp",
        ];
        let (mut ok, mut err) = (0, 0);
        for name in names {
            let orig = file(name);
            for _ in 0..150 {
                let mut b = orig.clone();
                for _ in 0..1 + rng.next() % 4 {
                    let i = (rng.next() % b.len() as u64) as usize;
                    match rng.next() % 3 {
                        0 => b[i] ^= 1 << (rng.next() % 8),
                        1 => b[i] = rng.next() as u8,
                        _ => b[i] = [0, 0xff, 0x7f, 0x80][(rng.next() % 4) as usize],
                    }
                }
                match decode(&b, 1 << 20) {
                    Ok(img) => {
                        ok += 1;
                        assert!(img.width * img.height <= 1 << 20);
                        let p = preprocess(&img, &cfg).unwrap();
                        assert!(!p.tiles.is_empty());
                    }
                    Err(Error::Input(_)) => err += 1,
                    Err(e) => panic!("{name}: not an input error: {e}"),
                }
            }
        }
        assert!(ok > 0 && err > 0, "ok {ok} err {err}");
    }

    #[test]
    fn config_from_json() {
        // transformers' defaults, and LFM2-VL's preprocessor_config.json, which spells them out.
        assert_eq!(
            ProcessorConfig::from_json(&serde_json::json!({})).unwrap(),
            ProcessorConfig::default()
        );
        let hub = serde_json::json!({
            "do_image_splitting": true, "do_normalize": true, "do_pad": true, "do_rescale": true,
            "do_resize": true, "downsample_factor": 2, "encoder_patch_size": 16,
            "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Lfm2VlImageProcessor",
            "image_std": [0.5, 0.5, 0.5], "max_image_tokens": 256, "max_num_patches": 1024,
            "max_pixels_tolerance": 2.0, "max_tiles": 10, "min_image_tokens": 64, "min_tiles": 2,
            "processor_class": "Lfm2VlProcessor", "resample": 2,
            "rescale_factor": 0.00392156862745098, "return_row_col_info": false,
            "size": {"height": 512, "width": 512}, "tile_size": 512, "use_thumbnail": true
        });
        assert_eq!(
            ProcessorConfig::from_json(&hub).unwrap(),
            ProcessorConfig::default()
        );
        // processor_config.json nests the image processor; the processor's own flag is beside it.
        let nested = serde_json::json!({
            "image_processor": {"tile_size": 256, "max_tiles": 4, "image_mean": 0.25, "use_thumbnail": false},
            "use_image_special_tokens": false, "processor_class": "Lfm2VlProcessor"
        });
        let c = ProcessorConfig::from_json(&nested).unwrap();
        assert_eq!(
            (c.tile_size, c.max_tiles, c.image_mean, c.use_thumbnail),
            (256, 4, [0.25; 3], false)
        );
        assert!(!c.use_image_special_tokens);
        for bad in [
            serde_json::json!([]),
            serde_json::json!({"tile_size": "512"}),
            serde_json::json!({"tile_size": 0}),
            serde_json::json!({"tile_size": 100}),
            serde_json::json!({"encoder_patch_size": 0}),
            serde_json::json!({"downsample_factor": -1}),
            serde_json::json!({"min_tiles": 5, "max_tiles": 2}),
            serde_json::json!({"max_tiles": 1_000_000}),
            serde_json::json!({"max_image_tokens": 0}),
            serde_json::json!({"image_std": [0.5, 0.0, 0.5]}),
            serde_json::json!({"image_mean": [0.5, 0.5]}),
            serde_json::json!({"rescale_factor": 0}),
            serde_json::json!({"max_pixels_tolerance": -1.0}),
            serde_json::json!({"use_thumbnail": 1}),
        ] {
            assert!(
                matches!(ProcessorConfig::from_json(&bad), Err(Error::Config(_))),
                "{bad}"
            );
        }
        // min_tiles > max_tiles is fine when splitting is off (transformers checks it only then).
        assert!(ProcessorConfig::from_json(
            &serde_json::json!({"min_tiles": 5, "max_tiles": 2, "do_image_splitting": false})
        )
        .is_ok());
        assert!(matches!(
            ProcessorConfig::from_json(&serde_json::json!({"resample": 3})),
            Err(Error::Unsupported(_))
        ));
        // An image whose buffer does not match its size.
        let bad = Rgb8 {
            width: 4,
            height: 4,
            data: vec![0; 47],
        };
        assert!(matches!(
            preprocess(&bad, &ProcessorConfig::default()),
            Err(Error::Input(_))
        ));
        assert!(Rgb8::new(0, 3, vec![]).is_err());
    }
}
