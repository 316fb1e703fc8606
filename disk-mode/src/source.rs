//! The sender's side of a disk session, from `PATH...` to a running
//! pipeline: walk, group by device, build the manifest, and once the
//! receiver's [`Plan`] is in, start the readers for what it still needs.

use std::collections::HashSet;
use std::sync::Arc;

use super::devices::{DeviceGroup, DeviceMap};
use super::reader::{SendItem, SendPipeline};
use super::walk::{Kind, SourcePath, Walk};
use super::wire::{FileFailure, Manifest, ManifestEntry, Plan};
use super::{DiskOptions, Result, CHUNK_SIZE};

/// Everything the sender knows before the receiver answers.
pub(crate) struct SourceSet {
    pub(crate) manifest: Manifest,
    /// Things skipped while walking (symlinks, special files).
    pub(crate) warnings: Vec<String>,
    items: Vec<SendItem>,
    groups: Vec<Arc<DeviceGroup>>,
}

/// `--checksum`: the checksum of a source file before the session, so the
/// receiver can compare its copy's content.
fn pre_hash(src: &SourcePath, size: u64, follow: bool) -> Result<u64> {
    let io = |e| super::DiskError::from_io(src.display(), e);
    let file = super::reader::open_source(src, false, follow).map_err(io)?;
    super::partial::content_checksum(&file, size).map_err(io)
}

impl SourceSet {
    /// Walk `paths` for a transfer into `dest` on the receiver.
    #[cfg(test)]
    pub(crate) fn build(
        paths: &[std::path::PathBuf],
        dest: &str,
        opts: &DiskOptions,
    ) -> Result<SourceSet> {
        super::safepath::validate_dest(dest)?;
        SourceSet::from_walk(super::walk::walk(paths, opts.follow_symlinks)?, dest, opts)
    }

    /// The same from a walk already made (a pull's, beneath the server's
    /// root).
    pub(crate) fn from_walk(w: Walk, dest: &str, opts: &DiskOptions) -> Result<SourceSet> {
        super::safepath::validate_dest(dest)?;
        let mut map = DeviceMap::new(&opts.sysfs);
        let mut entries = Vec::with_capacity(w.entries.len());
        let mut items = Vec::new();
        for (i, e) in w.entries.iter().enumerate() {
            let id = u32::try_from(i).map_err(|_| super::DiskError::Refused {
                path: e.rel.clone(),
                reason: "more than 4 billion entries".into(),
            })?;
            let group = map.group_of(e.dev);
            let checksum = if opts.checksum && e.kind == Kind::File {
                Some(pre_hash(&e.src, e.size, opts.follow_symlinks)?)
            } else {
                None
            };
            entries.push(ManifestEntry {
                id,
                path: e.rel.clone(),
                dir: e.kind == Kind::Dir,
                size: e.size,
                mode: e.mode,
                mtime_sec: e.mtime.0,
                mtime_nsec: e.mtime.1,
                sparse: e.sparse,
                device: map.group(group).device.clone(),
                checksum,
            });
            if e.kind == Kind::File {
                items.push(SendItem {
                    id,
                    rel: e.rel.clone(),
                    src: e.src.clone(),
                    size: e.size,
                    mtime: e.mtime,
                    ino: e.ino,
                    sparse: e.sparse,
                    group,
                    from: 0,
                });
            }
        }
        Ok(SourceSet {
            manifest: Manifest {
                dest: dest.to_string(),
                resume: opts.resume,
                chunk_size: CHUNK_SIZE,
                entries,
            },
            warnings: w.warnings,
            items,
            groups: map.groups().to_vec(),
        })
    }

    pub(crate) fn groups(&self) -> &[Arc<DeviceGroup>] {
        &self.groups
    }

    /// Start reading what `plan` still needs. Returns the pipeline and the
    /// entries the receiver refused (as failures).
    pub(crate) fn start(
        self,
        plan: &Plan,
        opts: &DiskOptions,
    ) -> (Arc<SendPipeline>, Vec<FileFailure>) {
        let skip: HashSet<u32> = plan
            .skip
            .iter()
            .copied()
            .chain(plan.refused.iter().map(|r| r.id))
            .collect();
        let resume: std::collections::HashMap<u32, u64> = plan.resume.iter().copied().collect();
        let refused = plan.refused.clone();
        let items = self
            .items
            .into_iter()
            .filter(|i| !skip.contains(&i.id))
            .map(|mut i| {
                i.from = resume.get(&i.id).copied().unwrap_or(0).min(i.size);
                i
            })
            .collect();
        (SendPipeline::start(items, self.groups, opts), refused)
    }
}
