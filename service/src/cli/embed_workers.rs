//! Several workers over one stream of items, results handed on in the
//! items' order: `scd embed-batch --workers N` runs N model sessions on one
//! device this way, and writes their rows in corpus order.
//!
//! Memory stays bounded: at most `2 × workers` items are taken from the
//! stream ahead of the oldest result not yet handed on.

use std::collections::BTreeMap;
use std::sync::mpsc::{channel, sync_channel};
use std::sync::Mutex;

/// Runs `work(worker, item)` on `workers` threads over `items` and calls
/// `sink` with each result in the items' order. `sink` returning `Ok(true)`
/// stops the run (items not yet taken are left in the stream); an error
/// from `sink` stops it and is returned.
pub fn ordered<T: Send, R: Send>(
    workers: usize,
    items: impl IntoIterator<Item = T> + Send,
    work: impl Fn(usize, T) -> R + Sync,
    mut sink: impl FnMut(R) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let workers = workers.max(1);
    let (job_tx, job_rx) = sync_channel::<(usize, T)>(workers);
    let job_rx = Mutex::new(job_rx);
    std::thread::scope(|scope| {
        let (result_tx, result_rx) = channel::<(usize, R)>();
        // a ticket per item in flight: the feeder takes one, the sink gives it back
        let (ticket_tx, ticket_rx) = sync_channel::<()>(2 * workers);
        for _ in 0..2 * workers {
            ticket_tx.send(()).expect("the receiver is here");
        }
        scope.spawn(move || {
            for (seq, item) in items.into_iter().enumerate() {
                if ticket_rx.recv().is_err() || job_tx.send((seq, item)).is_err() {
                    break;
                }
            }
        });
        for worker in 0..workers {
            let (result_tx, job_rx, work) = (result_tx.clone(), &job_rx, &work);
            scope.spawn(move || loop {
                let job = job_rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((seq, item)) = job else { break };
                if result_tx.send((seq, work(worker, item))).is_err() {
                    break;
                }
            });
        }
        drop(result_tx);
        let mut pending = BTreeMap::new();
        let mut next = 0usize;
        for (seq, result) in result_rx {
            pending.insert(seq, result);
            while let Some(result) = pending.remove(&next) {
                next += 1;
                if sink(result)? {
                    return Ok(());
                }
                let _ = ticket_tx.send(());
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn results_come_in_item_order_whatever_the_worker_speeds() {
        for workers in [1, 3] {
            let mut got = Vec::new();
            let used = Mutex::new(vec![0usize; workers]);
            ordered(
                workers,
                0..40u64,
                |w, i| {
                    used.lock().unwrap()[w] += 1;
                    std::thread::sleep(Duration::from_millis((i * 7) % 5));
                    i * i
                },
                |r| {
                    got.push(r);
                    Ok(false)
                },
            )
            .unwrap();
            assert_eq!(got, (0..40u64).map(|i| i * i).collect::<Vec<_>>(), "{workers} workers");
            let used = used.into_inner().unwrap();
            assert_eq!(used.iter().sum::<usize>(), 40);
            if workers > 1 {
                assert!(used.iter().filter(|&&n| n > 0).count() > 1, "the work was shared: {used:?}");
            }
        }
    }

    #[test]
    fn a_stop_or_an_error_ends_the_run_without_taking_the_whole_stream() {
        let taken = AtomicUsize::new(0);
        let items = (0..1000).inspect(|_| {
            taken.fetch_add(1, Ordering::SeqCst);
        });
        let mut seen = 0;
        ordered(
            2,
            items,
            |_, i| i,
            |_| {
                seen += 1;
                Ok(seen == 5)
            },
        )
        .unwrap();
        assert_eq!(seen, 5);
        assert!(taken.load(Ordering::SeqCst) <= 5 + 2 * 2 + 1, "bounded read-ahead: {}", taken.load(Ordering::SeqCst));
        let e = ordered(2, 0..100, |_, i| i, |i| if i == 7 { anyhow::bail!("row {i} failed") } else { Ok(false) });
        assert_eq!(e.unwrap_err().to_string(), "row 7 failed");
    }
}
