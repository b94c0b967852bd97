//! `scd demo`: embed a sample agent context and rank it against a task.

use std::time::Instant;

use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};

use crate::config::ModelArgs;

/// Arguments of `scd demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// The task to rank the sample context against.
    #[arg(long, default_value = "Why did the payment service fail to charge customers?")]
    task: String,
}

const SAMPLE: &[&str] = &[
    "2026-11-30T00:12:03Z ERROR payments::db: connection pool exhausted (max=32) while charging order 8812",
    "The marketing team moved the weekly sync to Thursday afternoon.",
    "CREATE TABLE charges (id BIGSERIAL PRIMARY KEY, order_id BIGINT NOT NULL, amount_cents INT NOT NULL);",
    "fn charge(order: &Order) -> Result<Receipt> { let conn = pool.get()?; conn.execute(INSERT_CHARGE, order) }",
    "Our office plants are watered every Monday by the facilities team.",
    "User: the checkout page spins forever. Agent: the payment service is timing out on database connections.",
];

/// Runs `scd demo`.
pub fn run(model: &ModelArgs, args: DemoArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let encoder = model.load_encoder()?;
    let load_ms = t0.elapsed().as_millis();
    let t1 = Instant::now();
    let task = encoder.encode(&[args.task.as_str()], &EncodeOptions::new(InputKind::Query))?;
    let ctx = encoder.encode(SAMPLE, &EncodeOptions::new(InputKind::Passage))?;
    let embed_ms = t1.elapsed().as_millis();
    let mut ranked: Vec<(f32, usize)> =
        (0..ctx.len()).map(|i| (task.row(0).iter().zip(ctx.row(i)).map(|(a, b)| a * b).sum::<f32>(), i)).collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "model {} on {} (dim {}), loaded in {load_ms} ms, embedded in {embed_ms} ms",
        encoder.model_id(),
        encoder.provider(),
        encoder.dim()
    );
    println!("task: {}\n", args.task);
    for (score, i) in ranked {
        println!("{score:.4}  {}", SAMPLE[i]);
    }
    Ok(())
}
