//! Running fio for a side-by-side comparison and reading its JSON.
//!
//! This module owns the fio command line and the fields read from fio's JSON output
//! (`jobs[].read|write|trim.{iops, lat_ns.mean}`). It does not install fio; it says how.
//! fio 3.33 trims block devices only (`BLKDISCARD`; a regular file fails with `ENOTTY`), so
//! a trim job runs through fio on a device.

use std::path::Path;
use std::process::Command;

use crate::fio::job::JobSpec;

/// What fio measured for one job.
#[derive(Debug, Clone, Copy)]
pub struct FioResult {
    /// IOPS.
    pub iops: f64,
    /// Mean total latency (submission + completion), µs.
    pub mean_lat_us: f64,
}

/// An error running fio.
#[derive(Debug, thiserror::Error)]
pub enum FioError {
    /// fio is not installed.
    #[error("fio is not installed: install it with `apt-get install -y fio` (scripts/vs-fio.sh does this for you)")]
    Missing,
    /// fio failed.
    #[error("fio failed ({status}): {stderr}")]
    Failed {
        /// Exit status.
        status: String,
        /// fio's stderr.
        stderr: String,
    },
    /// fio's output was not the JSON expected.
    #[error("could not read fio's JSON output: {0}")]
    Output(String),
}

/// fio's version string, or `FioError::Missing`.
pub fn version() -> Result<String, FioError> {
    let out = Command::new("fio")
        .arg("--version")
        .output()
        .map_err(|_| FioError::Missing)?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `spec` with fio's `ioengine` on `file` (which must exist, `size` bytes).
pub fn run(ioengine: &str, file: &Path, size: u64, spec: &JobSpec) -> Result<FioResult, FioError> {
    let mut cmd = Command::new("fio");
    cmd.arg("--name=aio-bench")
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--size={size}"))
        .arg(format!("--rw={}", spec.pattern.fio_name()))
        .arg(format!("--bs={}", spec.bs))
        .arg("--direct=1")
        .arg("--time_based")
        .arg(format!("--runtime={}ms", spec.runtime.as_millis()))
        .arg(format!("--ramp_time={}ms", spec.ramp.as_millis()))
        .arg(format!("--ioengine={ioengine}"))
        .arg("--randrepeat=0")
        .arg("--norandommap")
        .arg("--output-format=json");
    if spec.fua {
        cmd.arg("--sync=dsync");
    }
    if ioengine == "psync" {
        // Synchronous engines run one request per job: depth comes from parallel jobs.
        cmd.arg(format!("--numjobs={}", spec.iodepth))
            .arg("--group_reporting")
            .arg("--thread");
    } else {
        cmd.arg(format!("--iodepth={}", spec.iodepth));
    }
    let out = cmd.output().map_err(|_| FioError::Missing)?;
    if !out.status.success() {
        return Err(FioError::Failed {
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let sides = spec.pattern.fio_sides(spec.rwmixread);
    parse(&String::from_utf8_lossy(&out.stdout), sides)
}

/// Reads IOPS and mean latency from fio's JSON (the first job, or the group report) over
/// `sides` ([`Pattern::fio_sides`](crate::load::Pattern::fio_sides): `read`, `write`, both for
/// a mixed job, or `trim`), together: IOPS added, latency weighted by IOPS.
pub fn parse(json: &str, sides: &[&str]) -> Result<FioResult, FioError> {
    // fio may print notes before the JSON object.
    let start = json
        .find('{')
        .ok_or_else(|| FioError::Output("no JSON object".into()))?;
    let v: serde_json::Value =
        serde_json::from_str(&json[start..]).map_err(|e| FioError::Output(e.to_string()))?;
    let (mut iops, mut weighted_lat) = (0.0, 0.0);
    for side in sides {
        let job = &v["jobs"][0][side];
        let side_iops = job["iops"]
            .as_f64()
            .ok_or_else(|| FioError::Output(format!("jobs[0].{side}.iops missing")))?;
        let lat = job["lat_ns"]["mean"]
            .as_f64()
            .ok_or_else(|| FioError::Output(format!("jobs[0].{side}.lat_ns.mean missing")))?;
        iops += side_iops;
        weighted_lat += side_iops * lat;
    }
    let mean_lat_ns = if iops > 0.0 { weighted_lat / iops } else { 0.0 };
    Ok(FioResult {
        iops,
        mean_lat_us: mean_lat_ns / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json() {
        let json = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version":"fio-3.33","jobs":[{"jobname":"x","read":{"io_bytes":4096,"iops":1234.5,
"lat_ns":{"min":1,"max":9,"mean":40500.0}},"write":{"iops":0.0,"lat_ns":{"mean":0.0}}}]}"#;
        let r = parse(json, &["read"]).unwrap();
        assert_eq!(r.iops, 1234.5);
        assert_eq!(r.mean_lat_us, 40.5);
        let mixed = r#"{"jobs":[{"read":{"iops":300.0,"lat_ns":{"mean":1000.0}},
"write":{"iops":100.0,"lat_ns":{"mean":5000.0}}}]}"#;
        let m = parse(mixed, &["read", "write"]).unwrap();
        assert_eq!(m.iops, 400.0, "a mixed job's IOPS are both sides'");
        assert_eq!(m.mean_lat_us, 2.0, "latency weighted by IOPS");
        assert_eq!(parse(mixed, &["write"]).unwrap().iops, 100.0);
        let trim = r#"{"jobs":[{"trim":{"iops":50.0,"lat_ns":{"mean":3000.0}}}]}"#;
        assert_eq!(parse(trim, &["trim"]).unwrap().iops, 50.0);
        assert!(parse("{}", &["read"]).is_err());
        assert!(parse("garbage", &["read"]).is_err());
    }
}
