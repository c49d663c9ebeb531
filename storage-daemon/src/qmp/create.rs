//! `blockdev-create`: an image created by a job (type `create`), as QEMU's `block/create.c`
//! runs it: the options checked as QEMU's schema reads them, the job started (`created`,
//! `running`), the creation run on a thread of its own, and the job concluded with QEMU's
//! text on failure; it stays `concluded` until `job-dismiss` (QEMU's `JOB_MANUAL_DISMISS`).
//!
//! * `driver=file`: `filename`, `size`, `preallocation` (`off`, `falloc`, `full`), `nocow`
//!   and `extent-size-hint` (taken, as QEMU takes them where the file system ignores them).
//! * `driver=qcow2`: `file` (the node-name of a file node added by `blockdev-add`), `size`,
//!   `version`, `cluster-size`, `lazy-refcounts`, `refcount-bits`, `backing-file`,
//!   `backing-fmt`, `preallocation=off`.
//! * A driver QEMU creates with but this daemon does not is refused, naming the two served;
//!   a driver QEMU cannot create with gets QEMU's text.
//!
//! This module owns reading the options and running the creation as a job; the creation
//! itself is aio-block's ([`aio_block::create`]), the job's lifecycle the job table's.

use std::path::PathBuf;

use serde_json::{json, Value};

use aio_block::create::{FileCreate, Preallocation, Qcow2Create, Qcow2Version};

use super::commands::{Command, State};
use super::wire::{Args, QmpError};
use crate::blockdev::node::Node;
use crate::job::{JobFlags, JobHandle, JobType};

/// `blockdev-create`.
pub(super) const COMMANDS: &[Command] = &[Command {
    name: "blockdev-create",
    run: |state, _, args| state.blockdev_create(args),
}];

/// QEMU's `BlockdevDriver` names.
const BLOCKDEV_DRIVERS: &[&str] = &[
    "blkdebug",
    "blklogwrites",
    "blkreplay",
    "blkverify",
    "bochs",
    "cloop",
    "compress",
    "copy-before-write",
    "copy-on-read",
    "dmg",
    "file",
    "snapshot-access",
    "ftp",
    "ftps",
    "gluster",
    "host_cdrom",
    "host_device",
    "http",
    "https",
    "io_uring",
    "iscsi",
    "luks",
    "nbd",
    "nfs",
    "null-aio",
    "null-co",
    "nvme",
    "nvme-io_uring",
    "parallels",
    "preallocate",
    "qcow",
    "qcow2",
    "qed",
    "quorum",
    "raw",
    "rbd",
    "replication",
    "ssh",
    "throttle",
    "vdi",
    "vhdx",
    "virtio-blk-vfio-pci",
    "virtio-blk-vhost-user",
    "virtio-blk-vhost-vdpa",
    "vmdk",
    "vpc",
    "vvfat",
];

/// The drivers QEMU can create images with (those with a `bdrv_co_create`).
const QEMU_CREATES: &[&str] = &[
    "file",
    "gluster",
    "luks",
    "nfs",
    "parallels",
    "qcow",
    "qcow2",
    "qed",
    "rbd",
    "ssh",
    "vdi",
    "vhdx",
    "vmdk",
    "vpc",
];

/// QEMU's flags for a create job: finalized at once, kept until dismissed.
const CREATE_FLAGS: JobFlags = JobFlags {
    auto_finalize: true,
    auto_dismiss: false,
};

/// What a create job makes.
enum Creation {
    /// A file.
    File(FileCreate),
    /// A qcow2 image on the file of a node (or the error QEMU gives for the node, which
    /// fails the job as QEMU's does).
    Qcow2(Result<PathBuf, String>, Qcow2Create),
}

impl Creation {
    fn run(self) -> Result<(), String> {
        match self {
            Creation::File(opts) => aio_block::create::create_file(&opts),
            #[cfg(feature = "qcow2")]
            Creation::Qcow2(file, opts) => aio_block::create::create_qcow2(&file?, &opts),
            #[cfg(not(feature = "qcow2"))]
            Creation::Qcow2(..) => {
                return Err(
                    "qcow2 images are not served: aio-storage-daemon was built without \
                            its qcow2 feature"
                        .to_string(),
                )
            }
        }
        .map_err(|e| e.to_string())
    }
}

impl State {
    /// `blockdev-create job-id options`.
    fn blockdev_create(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let job_id = args.str("job-id")?;
        let options = args
            .opt_object("options")?
            .ok_or_else(|| args.missing("options"))?;
        args.finish()?;
        let mut opts = Args::nested(options, "options".into());
        let driver = opts
            .opt_enum("driver", BLOCKDEV_DRIVERS)?
            .ok_or_else(|| opts.missing("driver"))?;
        let creation = match driver {
            "file" => Creation::File(file_options(opts)?),
            "qcow2" => self.qcow2_options(opts)?,
            other if QEMU_CREATES.contains(&other) => {
                return Err(QmpError::generic(format!(
                    "blockdev-create of driver '{other}' is not served by this daemon \
                     (drivers file and qcow2 are)"
                )))
            }
            _ => {
                opts.finish()?;
                return Err(QmpError::generic("Driver does not support blockdev-create"));
            }
        };
        let job = self.jobs.start(&job_id, JobType::Create, CREATE_FLAGS)?;
        job.set_remaining(1);
        spawn(job, creation);
        Ok(json!({}))
    }

    /// `driver=qcow2`'s options, its `file` node found.
    fn qcow2_options(&self, mut opts: Args) -> Result<Creation, QmpError> {
        let file = match opts.value("file")? {
            Value::String(name) => self.file_of(&name),
            Value::Object(_) => {
                return Err(QmpError::generic(format!(
                    "{}: an inline node is not served by blockdev-create here: give the \
                     node-name of a file node added by blockdev-add",
                    opts.path("file")
                )))
            }
            _ => {
                return Err(QmpError::generic(format!(
                    "Invalid parameter type for '{}', expected: BlockdevRef",
                    opts.path("file")
                )))
            }
        };
        for unserved in ["data-file", "data-file-raw", "encrypt"] {
            if opts.0.contains_key(unserved) {
                return Err(QmpError::generic(format!(
                    "{}: not served by blockdev-create here",
                    opts.path(unserved)
                )));
            }
        }
        if opts.opt_bool("extended-l2")? == Some(true) {
            return Err(QmpError::generic(format!(
                "{}=on: not served by blockdev-create here",
                opts.path("extended-l2")
            )));
        }
        let size = size(&mut opts, "size")?;
        let version = match opts.opt_enum("version", &["v2", "v3"])? {
            Some("v2") => Qcow2Version::V2,
            _ => Qcow2Version::V3,
        };
        let backing_file = opts.opt_str("backing-file")?;
        let backing_fmt = opts
            .opt_enum("backing-fmt", BLOCKDEV_DRIVERS)?
            .map(String::from);
        let cluster_size = opts.opt_u64("cluster-size")?;
        let preallocation = preallocation(&mut opts)?;
        let lazy_refcounts = opts.opt_bool("lazy-refcounts")?.unwrap_or(false);
        let refcount_bits = match opts.0.contains_key("refcount-bits") {
            true => Some(opts.int("refcount-bits")?),
            false => None,
        };
        if opts.opt_enum("compression-type", &["zlib", "zstd"])? == Some("zstd") {
            return Err(QmpError::generic(format!(
                "{}=zstd: not served by blockdev-create here",
                opts.path("compression-type")
            )));
        }
        opts.finish()?;
        Ok(Creation::Qcow2(
            file,
            Qcow2Create {
                size,
                version,
                cluster_size,
                lazy_refcounts,
                refcount_bits,
                backing_file,
                backing_fmt,
                preallocation,
            },
        ))
    }

    /// The file of node `name`, which a qcow2 image is written on; QEMU's text (or ours
    /// for a node that is not a file's) when there is none.
    fn file_of(&self, name: &str) -> Result<PathBuf, String> {
        match self.graph.nodes.get(name) {
            None => Err(format!(
                "Cannot find device='{name}' nor node-name='{name}'"
            )),
            Some(Node::Protocol {
                driver,
                filename,
                read_only,
                ..
            }) if driver == "file" || driver == "host_device" => {
                if *read_only {
                    Err("Block node is read-only".into())
                } else {
                    Ok(filename.clone())
                }
            }
            Some(_) => Err(format!(
                "node '{name}' is not a file node: blockdev-create writes a qcow2 image on a \
                 file or host_device node"
            )),
        }
    }
}

/// `driver=file`'s options.
fn file_options(mut opts: Args) -> Result<FileCreate, QmpError> {
    let filename = opts.str("filename")?;
    let size = size(&mut opts, "size")?;
    let preallocation = preallocation(&mut opts)?;
    // Tuning only (btrfs' no-copy-on-write, XFS' extent size hint): taken, not applied.
    opts.opt_bool("nocow")?;
    opts.opt_u64("extent-size-hint")?;
    opts.finish()?;
    Ok(FileCreate {
        filename: filename.into(),
        size,
        preallocation,
    })
}

/// A `size` member that must be given.
fn size(opts: &mut Args, key: &str) -> Result<u64, QmpError> {
    opts.opt_u64(key)?.ok_or_else(|| opts.missing(key))
}

/// The `preallocation` member (`off` when not given).
fn preallocation(opts: &mut Args) -> Result<Preallocation, QmpError> {
    Ok(opts
        .opt_enum("preallocation", &Preallocation::NAMES)?
        .and_then(Preallocation::from_name)
        .unwrap_or_default())
}

/// Runs `creation` on a thread of its own, reporting to `job`.
fn spawn(job: JobHandle, creation: Creation) {
    let on_thread = job.clone();
    let started = std::thread::Builder::new()
        .name("blockdev-create".into())
        .spawn(move || {
            let ret = creation.run();
            on_thread.progress(1);
            on_thread.finish(ret);
        });
    if let Err(e) = started {
        job.progress(1);
        job.finish(Err(format!("Could not start the job: {e}")));
    }
}
