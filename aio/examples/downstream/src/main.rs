//! A downstream program with `aio = { features = ["epoll", "linux-aio"] }`: its engine and fd
//! monitor come by name from its configuration (here `ENGINE` and `FDMON` in the
//! environment), and a backend this build left out is refused with the feature to turn on.
//!
//! ```text
//! ENGINE=linux-aio FDMON=epoll cargo run   # runs
//! ENGINE=pool cargo run                    # exit 2: engine 'pool' is not in this build ...
//! ```

use aio::{AioContext, Backends, Choice, EngineKind, EngineOptions, Pairing};

fn main() {
    let engine = std::env::var("ENGINE").unwrap_or_else(|_| "auto".into());
    let fdmon = std::env::var("FDMON").unwrap_or_else(|_| "epoll".into());
    if let Err(e) = run(&fdmon, &engine) {
        eprintln!("downstream: {e}");
        std::process::exit(2);
    }
}

fn run(fdmon: &str, engine: &str) -> Result<(), Box<dyn std::error::Error>> {
    let fdmon: Pairing = fdmon.parse()?;
    let engine: Choice<EngineKind> = engine.parse()?;
    let backends = Backends::build(fdmon, engine, &EngineOptions::default())?;
    println!(
        "fd monitor {}, engine {}",
        backends.monitor.kind, backends.engine.kind
    );
    for report in &backends.engine.reports {
        println!("  {report}");
    }
    let ctx = AioContext::new(backends.monitor.built)?;
    let engine = ctx.attach_engine(backends.engine.built, |_, _| {})?;
    // One bottom half through the loop shows the pair runs.
    let ran = std::rc::Rc::new(std::cell::Cell::new(false));
    let flag = ran.clone();
    ctx.bh_schedule_oneshot(move |_| flag.set(true));
    ctx.poll(false);
    assert!(ran.get(), "the bottom half ran");
    println!("in flight: {}", engine.in_flight());
    Ok(())
}
