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

    fn compress(h: &mut [u32; 5], b: &[u8; 64]) {
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
        if self.fill == 0 {
            // Whole blocks straight from the input, without the copy.
            let mut blocks = data.chunks_exact(64);
            for b in &mut blocks {
                if let Ok(b) = <&[u8; 64]>::try_from(b) {
                    Self::compress(&mut self.h, b);
                }
            }
            data = blocks.remainder();
        }
        while !data.is_empty() {
            let n = (64 - self.fill).min(data.len());
            self.block[self.fill..self.fill + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
            if self.fill == 64 {
                Self::compress(&mut self.h, &self.block);
                self.fill = 0;
            }
        }
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
}
