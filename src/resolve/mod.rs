//! The resolve stage: rayon workers take chunks, decode their samples and turn sample
//! IPs, callchain entries and branch-stack ends into DSO hits against the model at
//! the sample's time. Results merge in chunk order, so output never depends on the
//! number of threads.

pub mod callchain;

use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::record::{misc, rt};
use crate::format::sample::{SampleLayout, sample_id, u64s};
use crate::input::PerfInput;
use crate::model::{DsoId, KERNEL_PID, Key, MapEntry, Model};
use crate::scan::{Chunk, Rec, Walker};
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::HashMap;

/// What the workers need besides the chunk.
pub struct Resolver<'a> {
    model: &'a Model,
    layouts: Vec<SampleLayout>,
    id_to_attr: HashMap<u64, usize>,
    sample_type0: u64,
    time_mode: bool,
    e: Endian,
    walk_branches: bool,
}

/// Per-chunk (and, merged, per-run) counts.
#[derive(Clone, Debug, Default)]
pub struct Hits {
    /// Samples touching each DSO, indexed by [`DsoId`].
    pub per_dso: Vec<u64>,
    /// Samples decoded.
    pub samples: u64,
    /// Samples of guest machines (not modelled).
    pub guest_samples: u64,
    /// Addresses (IPs, callchain entries, branch ends) that fell in no mapping.
    pub unmapped: u64,
    /// Samples whose event could not be identified.
    pub unknown_event: u64,
    /// Smallest and largest non-zero sample time.
    pub min_time: Option<u64>,
    /// See `min_time`.
    pub max_time: Option<u64>,
}

impl Hits {
    fn merge(&mut self, o: Hits) {
        if self.per_dso.len() < o.per_dso.len() {
            self.per_dso.resize(o.per_dso.len(), 0);
        }
        for (a, b) in self.per_dso.iter_mut().zip(o.per_dso) {
            *a += b;
        }
        self.samples += o.samples;
        self.guest_samples += o.guest_samples;
        self.unmapped += o.unmapped;
        self.unknown_event += o.unknown_event;
        self.min_time = match (self.min_time, o.min_time) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.max_time = match (self.max_time, o.max_time) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Scratch reused for every sample of a chunk.
struct SampleScratch {
    touched: Vec<DsoId>,
    last: Option<(u32, MapEntry)>,
}

impl SampleScratch {
    fn touch(&mut self, d: DsoId) {
        if !self.touched.contains(&d) {
            self.touched.push(d);
        }
    }
}

impl<'a> Resolver<'a> {
    /// Prepares sample layouts and the id → event table.
    pub fn new(model: &'a Model, attrs: &[Attr], time_mode: bool, e: Endian) -> Self {
        let mut id_to_attr = HashMap::new();
        for (i, a) in attrs.iter().enumerate() {
            for &id in &a.ids {
                id_to_attr.entry(id).or_insert(i);
            }
        }
        Resolver {
            model,
            layouts: attrs.iter().map(SampleLayout::new).collect(),
            id_to_attr,
            sample_type0: attrs[0].sample_type,
            time_mode,
            e,
            walk_branches: true,
        }
    }

    /// Resolves every chunk on the current rayon pool and merges in chunk order.
    pub fn run(
        &self,
        input: &PerfInput,
        chunks: &[Chunk],
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Hits> {
        let results: Vec<Result<Hits>> = chunks
            .par_iter()
            .map(|c| {
                let r = self.chunk(input, c);
                progress(c.end - c.start);
                r
            })
            .collect();
        let mut total = Hits {
            per_dso: vec![0; self.model.dsos.len()],
            ..Hits::default()
        };
        for r in results {
            total.merge(r?);
        }
        Ok(total)
    }

    /// Resolves one chunk.
    pub fn chunk(&self, input: &PerfInput, c: &Chunk) -> Result<Hits> {
        let df = &input.data_files[c.file];
        let mut hits = Hits {
            per_dso: vec![0; self.model.dsos.len()],
            ..Hits::default()
        };
        let mut scratch = SampleScratch {
            touched: Vec::with_capacity(64),
            last: None,
        };
        let mut walker = Walker::new(self.e, c.first_seq);
        let mut on_rec = |r: &Rec<'_>| -> Result<()> {
            if r.header.kind == rt::SAMPLE {
                self.sample(r, &mut hits, &mut scratch)?;
            }
            Ok(())
        };
        walker
            .walk(
                df,
                c.start,
                c.end,
                c.end - c.start,
                &mut on_rec,
                &mut |_, _| Ok(()),
            )
            .map_err(|e| e.in_file(&df.path))?;
        Ok(hits)
    }

    fn sample(&self, r: &Rec<'_>, hits: &mut Hits, sc: &mut SampleScratch) -> Result<()> {
        let e = self.e;
        let ai = if self.layouts.len() == 1 {
            0
        } else {
            match sample_id(r.bytes, e, self.sample_type0).and_then(|id| self.id_to_attr.get(&id)) {
                Some(&i) => i,
                None => {
                    hits.unknown_event += 1;
                    return Ok(());
                }
            }
        };
        let s = self.layouts[ai].decode(r.bytes, e).map_err(|err| {
            Error::format(
                r.offset,
                format!(
                    "{}SAMPLE record of size {}: {} (at byte {})",
                    if r.inner { "compressed " } else { "" },
                    r.bytes.len(),
                    err.what,
                    err.at
                ),
            )
        })?;
        hits.samples += 1;
        if let Some(t) = s.time.filter(|&t| t != 0) {
            hits.min_time = Some(hits.min_time.map_or(t, |m| m.min(t)));
            hits.max_time = Some(hits.max_time.map_or(t, |m| m.max(t)));
        }
        let cpumode = r.header.cpumode();
        if matches!(cpumode, misc::GUEST_KERNEL | misc::GUEST_USER) {
            hits.guest_samples += 1;
            return Ok(());
        }
        let key: Key = (
            if self.time_mode {
                s.time.unwrap_or(0)
            } else {
                0
            },
            r.seq,
        );
        let pid = s.pid;
        sc.touched.clear();
        sc.last = None;
        let model = self.model;
        let look = |space: u32, addr: u64, sc: &mut SampleScratch, unmapped: &mut u64| {
            if let Some((sp, m)) = sc.last
                && sp == space
                && m.start <= addr
                && addr < m.end
            {
                if let Some(d) = m.dso {
                    sc.touch(d);
                }
                return;
            }
            match model.lookup(space, addr, key) {
                Some(m) => {
                    sc.last = Some((space, m));
                    if let Some(d) = m.dso {
                        sc.touch(d);
                    }
                }
                None => *unmapped += 1,
            }
        };
        if let Some(ip) = s.ip {
            match cpumode {
                misc::KERNEL => look(KERNEL_PID, ip, sc, &mut hits.unmapped),
                misc::USER => {
                    if let Some(pid) = pid {
                        look(pid, ip, sc, &mut hits.unmapped)
                    }
                }
                _ => {}
            }
        }
        if !s.callchain.is_empty() {
            callchain::walk(u64s(s.callchain, e), |space, addr| match space {
                callchain::Space::Kernel => look(KERNEL_PID, addr, sc, &mut hits.unmapped),
                callchain::Space::User => {
                    if let Some(pid) = pid {
                        look(pid, addr, sc, &mut hits.unmapped)
                    }
                }
            });
        }
        if self.walk_branches && !s.branches.is_empty() {
            for entry in s.branches.chunks_exact(24) {
                for addr in [e.u64(entry, 0), e.u64(entry, 8)].into_iter().flatten() {
                    if addr == 0 {
                        continue;
                    }
                    let space = match pid {
                        Some(p) if !is_kernel_address(addr) => p,
                        _ => KERNEL_PID,
                    };
                    look(space, addr, sc, &mut hits.unmapped);
                }
            }
        }
        for &d in &sc.touched {
            if let Some(h) = hits.per_dso.get_mut(d as usize) {
                *h += 1;
            }
        }
        Ok(())
    }
}

/// Branch entries carry no cpumode; on x86_64 and arm64 the kernel lives in the upper
/// half of the address space.
fn is_kernel_address(addr: u64) -> bool {
    addr >> 63 == 1
}
