//! SHA-1 (FIPS 180-4), for the build IDs of JIT images: 20 bytes, as the GNU linker's
//! `--build-id=sha1` gives, from the image's contents alone.

/// A running SHA-1.
pub(crate) struct Sha1 {
    h: [u32; 5],
    block: [u8; 64],
    fill: usize,
    len: u64,
}

impl Default for Sha1 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha1 {
    /// A new hash.
    pub(crate) fn new() -> Self {
        Sha1 {
            h: [
                0x6745_2301,
                0xEFCD_AB89,
                0x98BA_DCFE,
                0x1032_5476,
                0xC3D2_E1F0,
            ],
            block: [0; 64],
            fill: 0,
            len: 0,
        }
    }

    /// One block, with the CPU's SHA instructions where it has them (x86-64 SHA-NI:
    /// a JIT image of tens of megabytes was a fifth of a `--jit` run in the portable
    /// code).
    fn compress(h: &mut [u32; 5], b: &[u8; 64]) {
        Self::compress_blocks(h, b);
    }

    /// [`Sha1::compress`] of each 64-byte block of `blocks` in turn (whole blocks).
    fn compress_blocks(h: &mut [u32; 5], blocks: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse4.1")
            && std::arch::is_x86_feature_detected!("ssse3")
        {
            // SAFETY: the features the function is compiled for are present.
            unsafe { ni::compress(h, blocks) };
            return;
        }
        for b in blocks.chunks_exact(64) {
            if let Ok(b) = <&[u8; 64]>::try_from(b) {
                Self::compress_portable(h, b);
            }
        }
    }

    fn compress_portable(h: &mut [u32; 5], b: &[u8; 64]) {
        let mut w = [0u32; 80];
        for (i, c) in b.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut bb, mut c, mut d, mut e] = *h;
        // Four rounds of twenty, each with its own function: no branch per step.
        macro_rules! rounds {
            ($range:expr, $k:expr, $f:expr) => {
                for wi in &w[$range] {
                    let f: u32 = $f(bb, c, d);
                    let t = a
                        .rotate_left(5)
                        .wrapping_add(f)
                        .wrapping_add(e)
                        .wrapping_add($k)
                        .wrapping_add(*wi);
                    e = d;
                    d = c;
                    c = bb.rotate_left(30);
                    bb = a;
                    a = t;
                }
            };
        }
        rounds!(0..20, 0x5A82_7999, |b: u32, c: u32, d: u32| (b & c)
            | (!b & d));
        rounds!(20..40, 0x6ED9_EBA1, |b: u32, c: u32, d: u32| b ^ c ^ d);
        rounds!(40..60, 0x8F1B_BCDC, |b: u32, c: u32, d: u32| (b & c)
            | (b & d)
            | (c & d));
        rounds!(60..80, 0xCA62_C1D6, |b: u32, c: u32, d: u32| b ^ c ^ d);
        h[0] = h[0].wrapping_add(a);
        h[1] = h[1].wrapping_add(bb);
        h[2] = h[2].wrapping_add(c);
        h[3] = h[3].wrapping_add(d);
        h[4] = h[4].wrapping_add(e);
    }

    /// Adds bytes.
    pub(crate) fn update(&mut self, mut data: &[u8]) {
        self.len = self.len.wrapping_add(data.len() as u64);
        if self.fill > 0 {
            // Top up the partial block first.
            let n = (64 - self.fill).min(data.len());
            self.block[self.fill..self.fill + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
            if self.fill < 64 {
                return;
            }
            Self::compress(&mut self.h, &self.block);
            self.fill = 0;
        }
        // Whole blocks straight from the input, without the copy, in one call (the
        // image's pieces rarely end on a block boundary: going block by block through
        // the buffer after the first such piece tripled the hashing time).
        let whole = data.len() - data.len() % 64;
        Self::compress_blocks(&mut self.h, &data[..whole]);
        let rest = &data[whole..];
        self.block[..rest.len()].copy_from_slice(rest);
        self.fill = rest.len();
    }

    /// The digest.
    pub(crate) fn finish(mut self) -> [u8; 20] {
        let bits = self.len.wrapping_mul(8);
        self.update(&[0x80]);
        while self.fill != 56 {
            self.update(&[0]);
        }
        self.update(&bits.to_be_bytes());
        let mut out = [0u8; 20];
        for (i, v) in self.h.iter().enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
        }
        out
    }
}

/// The SHA-NI block function (the instruction sequence of Intel's SHA extensions
/// paper: four rounds per `sha1rnds4`, the message schedule four words at a time).
#[cfg(target_arch = "x86_64")]
mod ni {
    use std::arch::x86_64::*;

    /// Each whole 64-byte block of `blocks`, the state kept in registers between them.
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    pub(super) unsafe fn compress(h: &mut [u32; 5], blocks: &[u8]) {
        // SAFETY: `h` holds at least 4 words (an unaligned 16-byte load).
        let mut abcd = _mm_shuffle_epi32(unsafe { _mm_loadu_si128(h.as_ptr().cast()) }, 0x1B);
        let mut e = _mm_set_epi32(h[4] as i32, 0, 0, 0);
        for b in blocks.chunks_exact(64) {
            (abcd, e) = block(abcd, e, b);
        }
        abcd = _mm_shuffle_epi32(abcd, 0x1B);
        // SAFETY: as the load.
        unsafe { _mm_storeu_si128(h.as_mut_ptr().cast(), abcd) };
        h[4] = _mm_extract_epi32::<3>(e) as u32;
    }

    /// One 64-byte block `b` on the state (abcd, e in its highest lane).
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn block(mut abcd: __m128i, e_save: __m128i, b: &[u8]) -> (__m128i, __m128i) {
        // Big-endian words, first word in the highest lane.
        let mask = _mm_set_epi64x(0x0001_0203_0405_0607, 0x0809_0a0b_0c0d_0e0f);
        let abcd_save = abcd;
        let lane = |i: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[16 * i..16 * i + 16]);
            // SAFETY: a 16-byte array read unaligned.
            _mm_shuffle_epi8(unsafe { _mm_loadu_si128(a.as_ptr().cast()) }, mask)
        };
        let mut m = [lane(0), lane(1), lane(2), lane(3)];
        // e for the next four rounds (`ea`) and abcd before them (`eb`), swapping.
        let mut ea = _mm_add_epi32(e_save, m[0]);
        let mut eb = abcd;
        abcd = _mm_sha1rnds4_epu32::<0>(abcd, ea);
        macro_rules! four {
            ($k:expr, $f:literal, $first:expr) => {{
                let k: usize = $k;
                std::mem::swap(&mut ea, &mut eb);
                ea = _mm_sha1nexte_epu32(ea, m[k]);
                eb = abcd;
                if !$first {
                    m[(k + 1) % 4] = _mm_sha1msg2_epu32(m[(k + 1) % 4], m[k]);
                }
                abcd = _mm_sha1rnds4_epu32::<$f>(abcd, ea);
                m[(k + 3) % 4] = _mm_sha1msg1_epu32(m[(k + 3) % 4], m[k]);
                if k >= 2 || !$first {
                    m[(k + 2) % 4] = _mm_xor_si128(m[(k + 2) % 4], m[k]);
                }
            }};
        }
        // Rounds 4-15: the message words still loading (no msg2 yet).
        four!(1, 0, true);
        four!(2, 0, true);
        four!(3, 0, false);
        // Rounds 16-79.
        for g in 4..20usize {
            let k = g % 4;
            match g / 5 {
                0 => four!(k, 0, false),
                1 => four!(k, 1, false),
                2 => four!(k, 2, false),
                _ => four!(k, 3, false),
            }
        }
        std::mem::swap(&mut ea, &mut eb);
        (
            _mm_add_epi32(abcd, abcd_save),
            _mm_sha1nexte_epu32(ea, e_save),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Sha1;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn known_digests() {
        assert_eq!(
            hex(&Sha1::new().finish()),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        let mut s = Sha1::new();
        s.update(b"abc");
        assert_eq!(hex(&s.finish()), "a9993e364706816aba3e25717850c26c9cd0d89d");
        let mut s = Sha1::new();
        for _ in 0..1000 {
            s.update(b"a");
        }
        let mut t = Sha1::new();
        t.update(&[b'a'; 1000]);
        assert_eq!(hex(&s.finish()), hex(&t.finish()));
    }

    /// Any cut of the input into pieces gives the digest of the whole (FIPS 180's
    /// million `a`s), whatever the pieces' sizes against the block.
    #[test]
    fn pieces_give_the_digest_of_the_whole() {
        let data = vec![b'a'; 1_000_000];
        let million = "34aa973cd4c4daa4f61eeb2bdbad27316534016f";
        let mut whole = Sha1::new();
        whole.update(&data);
        assert_eq!(hex(&whole.finish()), million);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20 {
            let mut s = Sha1::new();
            let mut rest = &data[..];
            while !rest.is_empty() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Pieces from 0 to 300 bytes: under, at and over a block.
                let n = ((x % 301) as usize).min(rest.len());
                s.update(&rest[..n]);
                rest = &rest[n..];
            }
            assert_eq!(hex(&s.finish()), million);
        }
    }

    /// The CPU's block function (where it has one) and the portable one agree.
    #[test]
    fn both_block_functions_agree() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..200 {
            let mut b = [0u8; 64];
            for v in &mut b {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            let mut h1 = [x as u32, (x >> 32) as u32, 3, 4, 5];
            let mut h2 = h1;
            Sha1::compress(&mut h1, &b);
            Sha1::compress_portable(&mut h2, &b);
            assert_eq!(h1, h2);
            // Many blocks at once: the state carried between them.
            let two = [b, b].concat();
            Sha1::compress_blocks(&mut h1, &two);
            Sha1::compress_portable(&mut h2, &b);
            Sha1::compress_portable(&mut h2, &b);
            assert_eq!(h1, h2);
        }
    }
}
