//! Batches on their way to the model: the padded host buffers of one batch
//! ([`HostBatch`]), where a run's time went ([`Breakdown`]), and the driver
//! that runs a batch plan serially or with the next batch assembled on a
//! producer thread while the current one runs (`overlap`).
//!
//! The driver knows nothing of ONNX Runtime: it hands each assembled batch to
//! a `run` closure (which reports its device-side phases in [`BatchTimes`])
//! and each result, in plan order, to a `consume` closure (timed as pooling),
//! so the overlapped and serial paths are one code path and tested as such.

use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::Sequence;

/// Assembled batches waiting for the model when overlapped: the one being
/// run, one ready, one being built.
const AHEAD: usize = 2;

/// One padded batch in host memory: `rows × len` token ids and mask.
#[derive(Debug)]
pub(crate) struct HostBatch {
    /// Rows (sequences).
    pub rows: usize,
    /// Longest row: every row is padded to it.
    pub len: usize,
    /// `rows × len` ids, zero-padded.
    pub ids: Vec<i64>,
    /// `rows × len`, 1 on real tokens.
    pub mask: Vec<i64>,
    /// Real (unpadded) tokens.
    pub real: usize,
}

impl HostBatch {
    /// The padded batch of `members` (indices into `seqs`).
    pub fn assemble(seqs: &[Sequence], members: &[usize]) -> HostBatch {
        let rows = members.len();
        let len = members.iter().map(|&i| seqs[i].ids.len()).max().unwrap_or(0);
        let mut ids = vec![0i64; rows * len];
        let mut mask = vec![0i64; rows * len];
        let mut real = 0;
        for (r, &i) in members.iter().enumerate() {
            let s = &seqs[i].ids;
            ids[r * len..r * len + s.len()].copy_from_slice(s);
            mask[r * len..r * len + s.len()].iter_mut().for_each(|m| *m = 1);
            real += s.len();
        }
        HostBatch { rows, len, ids, mask, real }
    }
}

/// Device-side phases of one batch, as the runner measured them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BatchTimes {
    /// Inputs into (pinned) host tensors, bound, and copied to the device.
    pub h2d: Duration,
    /// The model's run.
    pub model: Duration,
    /// The output back in host memory.
    pub d2h: Duration,
    /// Host-side pooling of `last_hidden_state` (the unbound path only).
    pub pool: Duration,
}

/// Where one encoding run's time went, in seconds per phase, with the padded
/// and real token counts of its batches. Runs add up with [`Breakdown::add`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Model calls.
    pub batches: usize,
    /// Tokens of the sequences (what throughput counts).
    pub real_tokens: usize,
    /// `rows × longest row`, summed over batches: what the model computed on.
    pub padded_tokens: usize,
    /// Building the padded id and mask buffers. With overlap this ran on the
    /// producer thread, beside the model, and is not part of `total_s`.
    pub assemble_s: f64,
    /// The model thread waiting for the next assembled batch (overlap only).
    pub wait_s: f64,
    /// Inputs staged (pinned host memory on CUDA), bound and copied to the device.
    pub h2d_s: f64,
    /// The model's run (with the device→host copy inside it unless copies are split).
    pub model_s: f64,
    /// The output copied back to host memory.
    pub d2h_s: f64,
    /// Host-side pooling, window averages and L2 normalization.
    pub pool_s: f64,
    /// Wall time of the runs on the model thread.
    pub total_s: f64,
    /// Whether assembly ran on a producer thread.
    pub overlapped: bool,
}

impl Breakdown {
    /// Adds `other`'s counts and times to `self`.
    pub fn add(&mut self, other: &Breakdown) {
        self.batches += other.batches;
        self.real_tokens += other.real_tokens;
        self.padded_tokens += other.padded_tokens;
        self.assemble_s += other.assemble_s;
        self.wait_s += other.wait_s;
        self.h2d_s += other.h2d_s;
        self.model_s += other.model_s;
        self.d2h_s += other.d2h_s;
        self.pool_s += other.pool_s;
        self.total_s += other.total_s;
        self.overlapped |= other.overlapped;
    }

    /// The phases spent on the model thread: they cannot exceed `total_s`.
    pub fn model_thread_s(&self) -> f64 {
        let assemble = if self.overlapped { 0.0 } else { self.assemble_s };
        assemble + self.wait_s + self.h2d_s + self.model_s + self.d2h_s + self.pool_s
    }

    /// Share of the computed tokens that were padding (0 when nothing ran).
    pub fn padding_share(&self) -> f64 {
        if self.padded_tokens == 0 {
            return 0.0;
        }
        1.0 - self.real_tokens as f64 / self.padded_tokens as f64
    }

    fn count(&mut self, batch: &HostBatch, t: BatchTimes) {
        self.batches += 1;
        self.real_tokens += batch.real;
        self.padded_tokens += batch.rows * batch.len;
        self.h2d_s += t.h2d.as_secs_f64();
        self.model_s += t.model.as_secs_f64();
        self.d2h_s += t.d2h.as_secs_f64();
        self.pool_s += t.pool.as_secs_f64();
    }
}

/// Runs the batches of `plan` (indices into `seqs`) through `run`, handing
/// each output to `consume` with its plan index, in plan order. With
/// `overlap`, a producer thread assembles up to [`AHEAD`] batches ahead of
/// the model; without, each batch is assembled just before it runs. The
/// first error stops the run (the producer sees the channel close).
pub(crate) fn drive<E>(
    seqs: &[Sequence],
    plan: &[Vec<usize>],
    overlap: bool,
    mut run: impl FnMut(&HostBatch) -> Result<(Vec<f32>, BatchTimes), E>,
    mut consume: impl FnMut(usize, Vec<f32>),
) -> Result<Breakdown, E> {
    let started = Instant::now();
    let mut b = Breakdown { overlapped: overlap, ..Breakdown::default() };
    let mut step = |b: &mut Breakdown, index: usize, batch: &HostBatch| -> Result<(), E> {
        let (out, times) = run(batch)?;
        b.count(batch, times);
        let t = Instant::now();
        consume(index, out);
        b.pool_s += t.elapsed().as_secs_f64();
        Ok(())
    };
    if !overlap {
        for (index, members) in plan.iter().enumerate() {
            let t = Instant::now();
            let batch = HostBatch::assemble(seqs, members);
            b.assemble_s += t.elapsed().as_secs_f64();
            step(&mut b, index, &batch)?;
        }
        b.total_s = started.elapsed().as_secs_f64();
        return Ok(b);
    }
    let (tx, rx) = sync_channel::<HostBatch>(AHEAD - 1);
    let (result, assemble) = std::thread::scope(|scope| {
        let producer = scope.spawn(move || {
            let mut spent = Duration::ZERO;
            for members in plan {
                let t = Instant::now();
                let batch = HostBatch::assemble(seqs, members);
                spent += t.elapsed();
                if tx.send(batch).is_err() {
                    break; // the model thread stopped on an error
                }
            }
            spent
        });
        let consumed = (|| {
            for index in 0..plan.len() {
                let t = Instant::now();
                let Ok(batch) = rx.recv() else { break };
                b.wait_s += t.elapsed().as_secs_f64();
                step(&mut b, index, &batch)?;
            }
            Ok(())
        })();
        drop(rx);
        (consumed, producer.join().unwrap_or_default())
    });
    result?;
    b.assemble_s = assemble.as_secs_f64();
    b.total_s = started.elapsed().as_secs_f64();
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seqs(lens: &[usize]) -> Vec<Sequence> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| Sequence { text: i, ids: (1..=n as i64).collect(), weight: n as f32 })
            .collect()
    }

    /// A stand-in model: each row's output is its ids' sum and its length,
    /// after a pause that makes the phases measurable.
    fn fake_run(batch: &HostBatch) -> Result<(Vec<f32>, BatchTimes), String> {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let out = (0..batch.rows)
            .flat_map(|r| {
                let row = &batch.ids[r * batch.len..(r + 1) * batch.len];
                let n = batch.mask[r * batch.len..(r + 1) * batch.len].iter().sum::<i64>();
                [row.iter().sum::<i64>() as f32, n as f32]
            })
            .collect();
        Ok((out, BatchTimes { model: t.elapsed(), ..BatchTimes::default() }))
    }

    #[test]
    fn assembly_pads_every_row_to_the_longest() {
        let s = seqs(&[2, 4, 1]);
        let b = HostBatch::assemble(&s, &[2, 0, 1]);
        assert_eq!((b.rows, b.len, b.real), (3, 4, 7));
        assert_eq!(b.ids, vec![1, 0, 0, 0, 1, 2, 0, 0, 1, 2, 3, 4]);
        assert_eq!(b.mask, vec![1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn overlap_gives_the_serial_outputs_in_the_same_order() {
        let lens: Vec<usize> = (0..60).map(|i| 1 + (i * 37) % 23).collect();
        let s = seqs(&lens);
        let plan = super::super::plan_batches(&lens, 40, 8);
        let collect = |overlap| {
            let mut got = Vec::new();
            let b = drive(&s, &plan, overlap, fake_run, |i, out| got.push((i, out))).unwrap();
            (got, b)
        };
        let (serial, bs) = collect(false);
        let (overlapped, bo) = collect(true);
        assert_eq!(serial.len(), plan.len());
        assert_eq!(serial, overlapped, "same outputs, same order");
        assert!(serial.iter().enumerate().all(|(k, (i, _))| *i == k), "plan order");
        for b in [&bs, &bo] {
            assert_eq!(b.batches, plan.len());
            assert_eq!(b.real_tokens, lens.iter().sum::<usize>());
            assert!(b.padded_tokens >= b.real_tokens);
        }
        assert!(!bs.overlapped && bo.overlapped);
        assert_eq!(bs.wait_s, 0.0, "the serial path never waits for a producer");
    }

    #[test]
    fn the_phases_sum_to_within_the_total() {
        let lens: Vec<usize> = (0..40).map(|i| 1 + (i * 13) % 31).collect();
        let s = seqs(&lens);
        let plan = super::super::plan_batches(&lens, 64, 16);
        for overlap in [false, true] {
            let b = drive(&s, &plan, overlap, fake_run, |_, _| {}).unwrap();
            assert!(b.model_s >= 0.002 * plan.len() as f64, "the pauses are counted: {b:?}");
            assert!(b.model_thread_s() <= b.total_s + 1e-9, "phases {} > total {}", b.model_thread_s(), b.total_s);
        }
    }

    #[test]
    fn an_error_stops_both_paths_at_the_failing_batch() {
        let lens: Vec<usize> = (1..=30).collect();
        let s = seqs(&lens);
        let plan = super::super::plan_batches(&lens, 30, 4);
        for overlap in [false, true] {
            let mut calls = 0;
            let mut consumed = 0;
            let r = drive(
                &s,
                &plan,
                overlap,
                |b| {
                    calls += 1;
                    if calls == 3 {
                        return Err(format!("batch of {} rows failed", b.rows));
                    }
                    fake_run(b)
                },
                |_, _| consumed += 1,
            );
            assert!(r.unwrap_err().ends_with("rows failed"));
            assert_eq!((calls, consumed), (3, 2), "overlap {overlap}");
        }
    }

    #[test]
    fn breakdowns_add_up() {
        let a = Breakdown {
            batches: 2,
            real_tokens: 10,
            padded_tokens: 16,
            model_s: 1.0,
            total_s: 1.5,
            ..Default::default()
        };
        let mut sum = a.clone();
        sum.add(&Breakdown { overlapped: true, ..a.clone() });
        assert_eq!((sum.batches, sum.real_tokens, sum.padded_tokens), (4, 20, 32));
        assert_eq!((sum.model_s, sum.total_s), (2.0, 3.0));
        assert!(sum.overlapped);
        assert!((sum.padding_share() - 0.375).abs() < 1e-12);
        assert_eq!(Breakdown::default().padding_share(), 0.0);
    }
}
