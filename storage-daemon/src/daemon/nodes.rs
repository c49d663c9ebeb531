//! [`NodeImages`]: the images the daemon's block nodes hold open themselves, by node name.
//!
//! This module owns which node keeps which image open and closing them all when the daemon
//! stops; a node's options are the graph's (`crate::blockdev`), opening an image is `open`'s
//! and `aio_block`'s, what QMP does with a node is `crate::qmp`'s.
//!
//! * **A node holds its image while it must stay open without a user:** a qcow2 node from
//!   `blockdev-add` on (QEMU's qcow2 driver opens and locks its file as soon as the node is
//!   added), a null node, and any node that has a dirty bitmap (the bitmap lives on the node,
//!   so it outlives the exports that come and go). An exported raw or file node without a
//!   bitmap is held by its exports only, and closed with the last one, so its locks go with
//!   its users as QEMU's `file` driver drops its permissions.
//! * **Exports share the node's image:** an export of a node that holds one serves that image,
//!   never a second opening of the file.
//! * **Closed after the exports:** the daemon stops every export first (their requests drained),
//!   then [`close_all`](NodeImages::close_all) closes the images here, which writes back what
//!   a qcow2 image caches.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use aio_block::image::OpenError;
use aio_block::{Image, ImageOptions};

/// The images the block nodes hold, by node name: cloned handles share one table (the
/// daemon's and its monitor's).
#[derive(Clone, Default)]
pub struct NodeImages(Rc<RefCell<HashMap<String, Arc<Image>>>>);

impl std::fmt::Debug for NodeImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<String> = self.0.borrow().keys().cloned().collect();
        names.sort();
        f.debug_tuple("NodeImages").field(&names).finish()
    }
}

impl NodeImages {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The image node `name` holds, if it holds one.
    pub fn get(&self, name: &str) -> Option<Arc<Image>> {
        self.0.borrow().get(name).cloned()
    }

    /// Makes node `name` hold `image` (the one it held before, if any, is returned).
    pub fn hold(&self, name: &str, image: Arc<Image>) -> Option<Arc<Image>> {
        self.0.borrow_mut().insert(name.to_string(), image)
    }

    /// Node `name` lets its image go (`blockdev-del`): closed unless an export still serves
    /// it.
    pub fn release(&self, name: &str) -> Option<Arc<Image>> {
        self.0.borrow_mut().remove(name)
    }

    /// Every image held, with its node's name, sorted by name.
    pub fn held(&self) -> Vec<(String, Arc<Image>)> {
        let mut all: Vec<_> = self
            .0
            .borrow()
            .iter()
            .map(|(n, i)| (n.clone(), i.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Closes every image held ([`Image::close`]: what it caches written, its files synced)
    /// and lets it go: the daemon's last step, after its exports have stopped. A failure is
    /// said on stderr, with the node's name; the other images are closed still.
    pub fn close_all(&self) {
        let images: Vec<(String, Arc<Image>)> = self.0.borrow_mut().drain().collect();
        for (name, image) in images {
            if let Err(e) = image.close() {
                eprintln!("aio-storage-daemon: block node '{name}': closing: {e}");
            }
        }
    }
}

/// Opens a node's image as an export or a node would: the null device of `size` for the
/// image `null`, else a file, block device or RBD image, `inactive` without its locks until
/// activated.
pub(crate) fn open_node_image(
    image: &Path,
    options: ImageOptions,
    size: Option<u64>,
    inactive: bool,
) -> Result<Image, OpenError> {
    match size {
        Some(size) if image.as_os_str() == "null" => Image::null(size, options),
        _ => super::rbd::open_image(image, options, inactive),
    }
}
