//! A tensor is a storage format tag + shape + bytes (memory-mapped or owned).

mod dtype;
pub use dtype::{ggml_type_name, DType};

use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

#[derive(Clone)]
enum Bytes {
    Mmap {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
        /// A shared mapping of a file (not anonymous memory): its pages can be dropped and
        /// are read back unchanged on the next access.
        file: bool,
    },
    Owned {
        v: Arc<Vec<u8>>,
        offset: usize,
        len: usize,
    },
}

/// A weight tensor in its stored format. Row-major: the last dimension is contiguous.
#[derive(Clone)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    bytes: Bytes,
    /// The same values in a layout a kernel prefers (`kernels::packed`), built on first use
    /// and shared by clones (a tied embedding and LM head).
    packed: Arc<OnceLock<Vec<u8>>>,
    /// `bytes` are already that layout ([`Tensor::prepacked`]).
    prepacked: bool,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {:?})", self.dtype, self.shape)
    }
}

impl Tensor {
    /// A view of `len` bytes at `offset` in `map`. The caller has checked the bounds.
    pub fn from_mmap(
        dtype: DType,
        shape: Vec<usize>,
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    ) -> Tensor {
        assert!(offset + len <= map.len());
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Mmap {
                map,
                offset,
                len,
                file: false,
            },
            packed: Arc::default(),
            prepacked: false,
        }
    }

    /// Marks a [`Tensor::from_mmap`] view as one of a file mapped shared (`Mmap::map`), whose
    /// pages [`Tensor::packed`] may hand back to the kernel once a packed copy exists.
    pub(crate) fn in_file_map(mut self) -> Tensor {
        if let Bytes::Mmap { file, .. } = &mut self.bytes {
            *file = true;
        }
        self
    }

    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Tensor {
        Tensor {
            dtype,
            shape,
            bytes: Bytes::Owned {
                len: bytes.len(),
                v: Arc::new(bytes),
                offset: 0,
            },
            packed: Arc::default(),
            prepacked: false,
        }
    }

    /// This tensor with its bytes declared to be the kernels' packed layout
    /// (`kernels::packed`), not the stored one: a copy made for the kernels (an F16 head's
    /// 8-bit copy) whose stored form nothing reads. [`Tensor::data`] is then the packed
    /// bytes, which [`Tensor::packed`] and [`Tensor::packed_if_built`] hand to the kernels
    /// (those that read stored rows rebuild them from it), so the values are in memory once.
    pub(crate) fn prepacked(self) -> Tensor {
        Tensor {
            prepacked: true,
            ..self
        }
    }

    pub fn from_f32(shape: Vec<usize>, data: &[f32]) -> Tensor {
        let mut b = Vec::with_capacity(data.len() * 4);
        for v in data {
            b.extend_from_slice(&v.to_le_bytes());
        }
        Tensor::from_bytes(DType::F32, shape, b)
    }

    pub fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mmap {
                map, offset, len, ..
            } => &map[*offset..*offset + *len],
            Bytes::Owned { v, offset, len } => &v[*offset..*offset + *len],
        }
    }

    /// Rows `first..first + n` (of all rows: a stacked `[E, R, C]` tensor's rows run
    /// expert by expert) as a `[n, C]` tensor sharing these bytes — one expert of a stacked
    /// tensor, or one half of a fused one — with its own packed copy. `None` when the range
    /// is outside the tensor.
    pub fn rows_view(&self, first: usize, n: usize) -> Option<Tensor> {
        if self.prepacked || first.checked_add(n)? > self.n_rows() {
            return None;
        }
        let rb = self.row_bytes();
        let (start, bytes_len) = (first * rb, n * rb);
        let bytes = match &self.bytes {
            Bytes::Mmap {
                map, offset, file, ..
            } => Bytes::Mmap {
                map: map.clone(),
                offset: offset + start,
                len: bytes_len,
                file: *file,
            },
            Bytes::Owned { v, offset, .. } => Bytes::Owned {
                v: v.clone(),
                offset: offset + start,
                len: bytes_len,
            },
        };
        Some(Tensor {
            dtype: self.dtype,
            shape: vec![n, self.row_len()],
            bytes,
            packed: Arc::default(),
            prepacked: false,
        })
    }

    /// The bytes in the kernels' preferred layout: `pack(self)` the first time. The kernels
    /// then read only that copy ([`Tensor::packed_if_built`]), so a file-mapped original's
    /// pages are handed back: the weights stay in memory once, not twice.
    pub(crate) fn packed(&self, pack: impl FnOnce(&Tensor) -> Vec<u8>) -> &[u8] {
        if self.prepacked {
            return self.data();
        }
        self.packed.get_or_init(|| {
            let p = pack(self);
            self.release_pages();
            p
        })
    }

    /// The packed copy, if [`Tensor::packed`] built it.
    pub(crate) fn packed_if_built(&self) -> Option<&[u8]> {
        if self.prepacked {
            return Some(self.data());
        }
        self.packed.get().map(Vec::as_slice)
    }

    /// Drop the resident pages wholly inside a file-mapped tensor (its neighbours' are kept):
    /// for a view whose bytes now live elsewhere (a packed or reordered copy).
    pub(crate) fn release_pages(&self) {
        #[cfg(unix)]
        if let Bytes::Mmap {
            map,
            offset,
            len,
            file: true,
        } = &self.bytes
        {
            // 4 KiB on x86 Linux; 16 KiB on Apple Silicon, 16 or 64 KiB on some ARM Linux
            // kernels (madvise takes whole pages: a 4 KiB guess would only fail there).
            static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
            let page = *PAGE.get_or_init(|| {
                // SAFETY: sysconf reads a system constant; no memory is passed.
                let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
                usize::try_from(p)
                    .ok()
                    .filter(|p| p.is_power_of_two())
                    .unwrap_or(4096)
            });
            let base = map.as_ptr() as usize;
            let start = (base + offset).next_multiple_of(page) - base;
            let end = (base + offset + len) / page * page - base;
            if end > start {
                // SAFETY: `map` is a read-only MAP_SHARED mapping of a file lone does not write
                // (`in_file_map`): MADV_DONTNEED only drops the pages from this process, and
                // the next access reads the same bytes back from the page cache or the file.
                // No reference sees different contents. Failure only means the pages stay.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Length of one row (the last dimension).
    pub fn row_len(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }

    pub fn n_rows(&self) -> usize {
        self.numel() / self.row_len().max(1)
    }

    pub fn row_bytes(&self) -> usize {
        self.row_len() / self.dtype.block_size() * self.dtype.block_bytes()
    }

    /// The stored bytes of row `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data()[i * rb..(i + 1) * rb]
    }

    /// Dequantize row `i` into `out` (length `row_len()`).
    pub fn row_to_f32(&self, i: usize, out: &mut [f32]) {
        crate::quant::dequantize_row(self.dtype, self.row(i), out)
            .expect("tensor rows are whole blocks (checked at load)");
    }

    /// The whole tensor as f32 (for small tensors: norms, biases, conv taps).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.numel()];
        crate::quant::dequantize_row(self.dtype, self.data(), &mut out)
            .expect("tensor sizes are whole blocks (checked at load)");
        out
    }
}
