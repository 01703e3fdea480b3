//! Sharding: which inputs one task of a job array owns (a fixed hash of each input's
//! relative path), and the shard of the Slurm or Kubernetes job this process runs in.

use crate::error::{Error, Result};
use std::path::Path;

/// 64-bit FNV-1a: the shard hash (fixed, documented, the same on every machine).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// MurmurHash3's 64-bit finalizer. FNV-1a alone is a poor shard hash: its low bits
/// depend only on the low bits of each byte (`host-a` and `host-e` would always share
/// a shard of 4); the finalizer mixes every bit into every other.
pub(crate) fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The shard hash of a relative path: `fmix64(fnv1a64(bytes))`, the same on every
/// machine and with every Rust version.
pub(crate) fn shard_hash(rel: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    fmix64(fnv1a64(rel.as_os_str().as_bytes()))
}

/// One task's share of the inputs: those whose relative path's `shard_hash` is
/// `index` modulo `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// 0-based.
    pub index: u64,
    /// Number of shards, at least 1.
    pub count: u64,
}

/// Environment variable giving the shard count of a Kubernetes Indexed Job (the job
/// sets `JOB_COMPLETION_INDEX` but not the number of completions).
pub const SHARD_COUNT_ENV: &str = "PDINJECT_SHARD_COUNT";

impl Shard {
    /// Parses `K/N` (1-based K, as in "shard 1 of 4").
    pub fn parse(s: &str) -> Result<Shard> {
        let bad = || Error::Usage(format!("--shard '{s}': expected K/N with 1 <= K <= N"));
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let k: u64 = k.trim().parse().map_err(|_| bad())?;
        let n: u64 = n.trim().parse().map_err(|_| bad())?;
        if k == 0 || n == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard {
            index: k - 1,
            count: n,
        })
    }

    /// The shard of the job array this process runs in: Slurm
    /// (`SLURM_ARRAY_TASK_ID`, with `SLURM_ARRAY_TASK_MIN`/`_MAX`/`_STEP` or `_COUNT`)
    /// or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`, with the count from
    /// `count` or [`SHARD_COUNT_ENV`]). `env` reads a variable.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>, count: Option<u64>) -> Result<Shard> {
        let num = |name: &str| -> Result<Option<u64>> {
            match env(name) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    Error::Usage(format!("--shard auto: {name}='{v}' is not a number"))
                }),
            }
        };
        let shard = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let step = num("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            let n = num("SLURM_ARRAY_TASK_COUNT")?;
            let range = num("SLURM_ARRAY_TASK_MAX")?
                .filter(|&max| max >= min)
                .map(|max| (max - min) / step + 1);
            let derived = match (range, n) {
                (Some(r), Some(n)) if r != n => {
                    return Err(Error::Usage(format!(
                        "--shard auto: the Slurm array is not a contiguous range ({n} tasks between {min} and the max): use --array=0-{} or --shard K/N",
                        n.saturating_sub(1)
                    )));
                }
                (Some(r), _) => r,
                (None, Some(n)) => n,
                (None, None) => {
                    return Err(Error::Usage(
                        "--shard auto: SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_MAX nor SLURM_ARRAY_TASK_COUNT".into(),
                    ));
                }
            };
            if let Some(c) = count
                && c != derived
            {
                return Err(Error::Usage(format!(
                    "--shard-count {c} contradicts the Slurm array's {derived} tasks"
                )));
            }
            if id < min || (id - min) % step != 0 {
                return Err(Error::Usage(format!(
                    "--shard auto: SLURM_ARRAY_TASK_ID {id} is not in the array's range"
                )));
            }
            Shard {
                index: (id - min) / step,
                count: derived,
            }
        } else if let Some(i) = num("JOB_COMPLETION_INDEX")? {
            let n = match count {
                Some(c) => c,
                None => num(SHARD_COUNT_ENV)?.ok_or_else(|| {
                    Error::Usage(format!(
                        "--shard auto in a Kubernetes Indexed Job needs the number of completions: --shard-count N or {SHARD_COUNT_ENV}"
                    ))
                })?,
            };
            Shard { index: i, count: n }
        } else {
            return Err(Error::Usage(
                "--shard auto: not in a Slurm job array (SLURM_ARRAY_TASK_ID) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)".into(),
            ));
        };
        if shard.count == 0 || shard.index >= shard.count {
            return Err(Error::Usage(format!(
                "--shard auto: index {} is not below the count {}",
                shard.index, shard.count
            )));
        }
        Ok(shard)
    }

    /// Whether this shard owns the input at `rel` (hash of its bytes, so the split
    /// does not depend on the order or the machine).
    pub fn owns(&self, rel: &Path) -> bool {
        shard_hash(rel) % self.count == self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn shard_parse_and_hash() {
        assert_eq!(Shard::parse("2/4").unwrap(), Shard { index: 1, count: 4 });
        for bad in ["0/4", "5/4", "1/0", "x", "1/", "/2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        // The published FNV-1a test vectors: the split must be the same everywhere.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
        let rels: Vec<PathBuf> = (0..100)
            .map(|i| PathBuf::from(format!("host{i}/perf.data")))
            .collect();
        for r in &rels {
            let owners = (1..=4)
                .filter(|k| Shard::parse(&format!("{k}/4")).unwrap().owns(r))
                .count();
            assert_eq!(owners, 1);
        }
        // Names that differ only in bytes with the same low bits still spread.
        let mut per = [0usize; 4];
        for c in ["a", "e", "i", "m", "q", "u", "y"] {
            for i in 0..8 {
                let r = PathBuf::from(format!("host-{c}{}/perf.data", i * 4));
                per[(shard_hash(&r) % 4) as usize] += 1;
            }
        }
        assert!(per.iter().all(|&n| n >= 6), "{per:?}");
        // Pinned: the split must not change between versions or machines.
        assert_eq!(shard_hash(Path::new("host1/perf.data")), {
            fmix64(fnv1a64(b"host1/perf.data"))
        });
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456bcfc34c2cb2c);
    }

    #[test]
    fn shard_from_env() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let s = |vars, c| Shard::from_env(&env(vars), c);
        assert_eq!(
            s(
                &[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_MIN", "0"),
                    ("SLURM_ARRAY_TASK_MAX", "3")
                ],
                None
            )
            .unwrap(),
            Shard { index: 3, count: 4 }
        );
        assert_eq!(
            s(
                &[
                    ("SLURM_ARRAY_TASK_ID", "5"),
                    ("SLURM_ARRAY_TASK_COUNT", "8")
                ],
                None
            )
            .unwrap(),
            Shard { index: 5, count: 8 }
        );
        // --array=1,3,7: not a range, no way to number the tasks 0..N.
        assert!(
            s(
                &[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_MAX", "7"),
                    ("SLURM_ARRAY_TASK_COUNT", "3")
                ],
                None
            )
            .is_err()
        );
        assert_eq!(
            s(&[("JOB_COMPLETION_INDEX", "2")], Some(5)).unwrap(),
            Shard { index: 2, count: 5 }
        );
        assert_eq!(
            s(
                &[("JOB_COMPLETION_INDEX", "0"), (SHARD_COUNT_ENV, "3")],
                None
            )
            .unwrap(),
            Shard { index: 0, count: 3 }
        );
        assert!(s(&[("JOB_COMPLETION_INDEX", "2")], None).is_err());
        assert!(s(&[("JOB_COMPLETION_INDEX", "5")], Some(5)).is_err());
        assert!(s(&[], Some(5)).is_err());
    }
}
