//! Sorted runs of fixed-size records on a scratch file, merged back into one order:
//! the external sort that keeps `--jit`'s memory independent of the jitdump's size
//! (a dump's list sorted by time, its records by address for the touched choice).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Records read at once from one run.
const CHUNK: usize = 2048;

/// One run being read: its next offset, the records left, its buffer and the
/// position in it.
struct Run {
    at: u64,
    left: u64,
    buf: Vec<u8>,
    pos: usize,
}

/// The records of runs of `N` bytes each on a file, each run sorted by `key`, read
/// in one order by `key` (ties: the earlier run first, so that a stable sort of each
/// run gives a stable sort of all).
pub(super) struct Merge<'a, const N: usize, K: Ord, F: Fn(&[u8; N]) -> K> {
    f: &'a File,
    runs: Vec<Run>,
    heads: BinaryHeap<Reverse<(K, usize)>>,
    current: Vec<Option<[u8; N]>>,
    key: F,
}

impl<'a, const N: usize, K: Ord, F: Fn(&[u8; N]) -> K> Merge<'a, N, K, F> {
    /// The runs of `f` at `(byte offset, records)`.
    pub(super) fn new(f: &'a File, runs: &[(u64, u64)], key: F) -> io::Result<Self> {
        let mut m = Merge {
            f,
            runs: runs
                .iter()
                .map(|&(at, left)| Run {
                    at,
                    left,
                    buf: Vec::new(),
                    pos: 0,
                })
                .collect(),
            heads: BinaryHeap::new(),
            current: vec![None; runs.len()],
            key,
        };
        for r in 0..runs.len() {
            m.advance(r)?;
        }
        Ok(m)
    }

    /// Puts run `r`'s next record in the heap.
    fn advance(&mut self, r: usize) -> io::Result<()> {
        let run = &mut self.runs[r];
        if run.pos >= run.buf.len() {
            if run.left == 0 {
                return Ok(());
            }
            let n = run.left.min(CHUNK as u64) as usize;
            run.buf.resize(n * N, 0);
            self.f.read_exact_at(&mut run.buf, run.at)?;
            run.at += (n * N) as u64;
            run.left -= n as u64;
            run.pos = 0;
        }
        let mut rec = [0u8; N];
        rec.copy_from_slice(&run.buf[run.pos..run.pos + N]);
        run.pos += N;
        self.heads.push(Reverse(((self.key)(&rec), r)));
        self.current[r] = Some(rec);
        Ok(())
    }

    /// The next record in order; `None` after the last.
    pub(super) fn next(&mut self) -> io::Result<Option<[u8; N]>> {
        let Some(Reverse((_, r))) = self.heads.pop() else {
            return Ok(None);
        };
        let rec = self.current[r].take();
        self.advance(r)?;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_in_key_order_earlier_run_first() {
        // Two runs of 2-byte records (key, tag), each sorted by key.
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(&[1, 0, 3, 1, 5, 2], 0).unwrap();
        f.write_all_at(&[1, 9, 2, 8], 6).unwrap();
        let mut m = Merge::new(&f, &[(0, 3), (6, 2)], |r: &[u8; 2]| r[0]).unwrap();
        let mut got = Vec::new();
        while let Some(r) = m.next().unwrap() {
            got.push(r);
        }
        assert_eq!(got, vec![[1, 0], [1, 9], [2, 8], [3, 1], [5, 2]]);
    }
}
