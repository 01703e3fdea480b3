//! Records replaced on the way out: the build-ID MMAP2 sink plans them, and it and
//! the stream sink write them into the bytes they pass on. Kept apart from both so
//! that their imports run one way: the MMAP2 sink wraps the stream sink, and both
//! take the splice from here.

/// One record replaced: `old_len` bytes at `offset` of data file `file` become `new`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Splice {
    /// Data file index (0: the header file's data section, or a stream).
    pub file: usize,
    /// Offset of the record.
    pub offset: u64,
    /// Its number in the input.
    pub seq: u64,
    /// Its size in the input.
    pub old_len: u64,
    /// The record in build-ID form.
    pub new: Vec<u8>,
}

impl Splice {
    /// Bytes the record grows by (32 for an MMAP, 0 for an MMAP2).
    pub(crate) fn grows(&self) -> u64 {
        self.new.len() as u64 - self.old_len
    }
}

/// Appends `bytes` (offset `at` of the input) to `out` with every splice that starts
/// in it replaced; a record that began in earlier bytes was replaced there and its
/// rest is skipped. `splices` are sorted by offset (one data file).
pub(crate) fn splice_into(out: &mut Vec<u8>, at: u64, bytes: &[u8], splices: &[Splice]) {
    let end = at + bytes.len() as u64;
    let first = splices.partition_point(|s| s.offset + s.old_len <= at);
    let mut cursor = at;
    for s in &splices[first..] {
        if s.offset >= end {
            break;
        }
        if s.offset >= at {
            out.extend_from_slice(&bytes[(cursor - at) as usize..(s.offset - at) as usize]);
            out.extend_from_slice(&s.new);
        }
        cursor = (s.offset + s.old_len).min(end).max(cursor);
    }
    out.extend_from_slice(&bytes[(cursor - at) as usize..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(offset: u64, old_len: u64, new: &[u8]) -> Splice {
        Splice {
            file: 0,
            offset,
            seq: 0,
            old_len,
            new: new.to_vec(),
        }
    }

    #[test]
    fn splices_across_windows() {
        let input: Vec<u8> = (0u8..40).collect();
        let s = [sp(4, 4, b"ABCDEFGH"), sp(14, 4, b"wxyz")];
        let mut whole = Vec::new();
        splice_into(&mut whole, 100, &input, &[]);
        assert_eq!(whole, input);
        let s100: Vec<Splice> = s
            .iter()
            .map(|x| sp(x.offset + 100, x.old_len, &x.new))
            .collect();
        let mut one = Vec::new();
        splice_into(&mut one, 100, &input, &s100);
        for cut in 1..input.len() {
            let mut two = Vec::new();
            splice_into(&mut two, 100, &input[..cut], &s100);
            splice_into(&mut two, 100 + cut as u64, &input[cut..], &s100);
            assert_eq!(two, one, "cut at {cut}");
        }
        assert_eq!(one.len(), input.len() + 4);
        assert_eq!(&one[4..12], b"ABCDEFGH");
        assert_eq!(&one[18..22], b"wxyz");
        assert_eq!(one[12], 8);
    }
}
