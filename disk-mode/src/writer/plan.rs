//! Planning a manifest against the destination: each entry refused, a
//! directory made, a file skipped as complete, or a file to write (from
//! where, by which writer).

use super::*;

/// The receiver's plan as it is drawn up, entry by entry of the manifest.
pub(super) struct Planning<'a> {
    pub(super) root: &'a Root,
    pub(super) manifest: &'a Manifest,
    pub(super) claimant: Option<&'a Claimant>,
    pub(super) claims: Option<ClaimSet>,
    pub(super) map: DeviceMap,
    pub(super) plan: Plan,
    pub(super) totals: Totals,
    /// Directories to create, with their entries (modes and times are set
    /// at the end).
    pub(super) dirs: Vec<(String, ManifestEntry)>,
}

impl Planning<'_> {
    /// Plans one entry at `path` (its wire path): refused, a directory made,
    /// a file skipped as complete, or a file to write (from where, on which
    /// device group).
    pub(super) fn entry(
        &mut self,
        e: &ManifestEntry,
        path: &str,
    ) -> Result<Option<Expect>, DiskError> {
        let path = path.to_string();
        let comps = safepath::components(&path)?;
        if let Some(c) = comps.iter().find(|c| partial::is_internal(c)) {
            return Err(DiskError::Refused {
                path: path.clone(),
                reason: format!("'{c}' is a name longhaul keeps for its own temporary files"),
            });
        }
        if !e.dir && e.size > MAX_FILE_SIZE {
            return Err(DiskError::Refused {
                path: path.clone(),
                reason: format!(
                    "{} bytes, more than the largest file this receiver takes ({MAX_FILE_SIZE} bytes, 1 PiB)",
                    e.size
                ),
            });
        }
        if e.dir {
            self.root.open_dir(&comps, true, &path)?;
            self.dirs.push((path.clone(), e.clone()));
            return Ok(None);
        }
        let (dir, name) = self.root.parent_of(&path, true)?;
        if let (Some(c), Some(set)) = (self.claimant, self.claims.as_mut()) {
            let key = ClaimKey {
                dir: dir
                    .identity()
                    .map_err(|err| DiskError::from_io(path.clone(), err))?,
                name: name.to_string(),
            };
            c.claim(set, key).map_err(|by| DiskError::InUse {
                path: path.clone(),
                by,
            })?;
        }
        let have = if self.manifest.resume {
            partial::what_we_have(&dir, name, e)
                .map_err(|err| DiskError::from_io(path.clone(), err))?
        } else {
            Have::Nothing
        };
        let from = match have {
            Have::Complete { by_checksum } => {
                self.skipped(e, by_checksum);
                return Ok(None);
            }
            Have::Partial(off) => {
                self.plan.resume.push((e.id, off));
                off
            }
            Have::Nothing => 0,
        };
        let dev = dir
            .dev()
            .map_err(|err| DiskError::from_io(path.clone(), err))?;
        let group = self.map.group_of(dev);
        Ok(Some(Expect {
            entry: e.clone(),
            path,
            from,
            worker: 0,
            group,
        }))
    }

    /// A file already complete here: skipped, and counted.
    pub(super) fn skipped(&mut self, e: &ManifestEntry, by_checksum: bool) {
        self.plan.skip.push(e.id);
        let totals = &mut self.totals;
        totals.files += 1;
        totals.file_bytes += e.size;
        totals.skipped += 1;
        totals.skipped_bytes += e.size;
        if by_checksum {
            totals.skipped_by_checksum += 1;
            totals.skipped_by_checksum_bytes += e.size;
        }
    }
}
