//! Cost of one rate-limit decision (filled in below).
use criterion::{Criterion, criterion_group, criterion_main};
use gateway_ratelimit::{Algorithm, LocalLimiter, Policy};

fn local(c: &mut Criterion) {
    let limiter = LocalLimiter::new(100_000);
    let policy = Policy::new("api", Algorithm::TokenBucket, u32::MAX / 1_000_000, 1).unwrap();
    let mut now = 0;
    c.bench_function("local_check_at", |b| {
        b.iter(|| {
            now += 1;
            limiter.check_at(&policy, "alice", now)
        })
    });
}

criterion_group!(benches, local);
criterion_main!(benches);
