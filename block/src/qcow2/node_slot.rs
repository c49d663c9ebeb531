//! Which block node a qcow2 image's unallocated clusters come from (QEMU's `backing=NODE`),
//! held for the image; reading through it is `node_backing.rs`'s. A leaf of the qcow2 module.

use std::sync::{Arc, PoisonError, RwLock};

use crate::image::hooks::BackingNode;

/// The node a qcow2 image's unallocated clusters come from, if any.
#[derive(Debug)]
pub(crate) struct NodeBacking {
    node: RwLock<Option<Arc<dyn BackingNode>>>,
    /// Whether the header's backing file is opened (false: a node stands for it, or none).
    opens_backing: bool,
}

impl NodeBacking {
    pub(crate) fn new(opens_backing: bool) -> Self {
        NodeBacking {
            node: RwLock::new(None),
            opens_backing,
        }
    }

    pub(crate) fn opens_backing(&self) -> bool {
        self.opens_backing
    }

    pub(crate) fn get(&self) -> Option<Arc<dyn BackingNode>> {
        if self.opens_backing {
            return None;
        }
        self.node
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, node: Option<Arc<dyn BackingNode>>) {
        *self.node.write().unwrap_or_else(PoisonError::into_inner) = node;
    }
}
