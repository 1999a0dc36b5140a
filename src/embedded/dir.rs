//! The data directory: which user runs PostgreSQL when we are root, whether that user can reach the
//! directory, and that the directory holds nothing but ours.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use nix::unistd::{Gid, Uid, User};

use super::{EmbeddedError, EmbeddedPostgres, PGDATA, Result, holds_cluster, io_err};

impl EmbeddedPostgres {
    pub(super) fn prepare_dir(&self) -> Result<()> {
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&self.dir, Some(uid), Some(gid)).map_err(|e| EmbeddedError::Io {
                what: "changing the owner of",
                path: self.dir.clone(),
                source: e.into(),
            })?;
        }
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err("setting the mode of", &self.dir))?;
        let pgdata = self.pgdata();
        let foreign = fs::read_dir(&self.dir)
            .map_err(io_err("reading", &self.dir))?
            .flatten()
            .any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                !(matches!(name.as_ref(), PGDATA | "postgres.log" | "tools.log")
                    || name.starts_with(".s.PGSQL"))
            });
        if foreign && !holds_cluster(&pgdata) {
            return Err(EmbeddedError::NotOurs(self.dir.clone()));
        }
        Ok(())
    }
}

pub(super) fn unprivileged_user() -> Result<Option<(Uid, Gid)>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    ["postgres", "nobody"]
        .iter()
        .find_map(|name| User::from_name(name).ok().flatten())
        .map(|u| Some((u.uid, u.gid)))
        .ok_or(EmbeddedError::NoUser)
}

pub(super) fn check_reachable(data_dir: &Path, uid: Uid, gid: Gid) -> Result<()> {
    let absolute = std::path::absolute(data_dir).map_err(io_err("resolving", data_dir))?;
    let Some(existing) = absolute.ancestors().skip(1).find(|a| a.is_dir()) else {
        return Ok(());
    };
    let existing = fs::canonicalize(existing).map_err(io_err("resolving", existing))?;
    let user = User::from_uid(uid).ok().flatten();
    let mut groups = vec![gid];
    if let Some(user) = &user {
        if let Ok(name) = std::ffi::CString::new(user.name.clone()) {
            groups.extend(nix::unistd::getgrouplist(&name, gid).unwrap_or_default());
        }
    }
    let mut on_the_way: Vec<&Path> = existing.ancestors().collect();
    on_the_way.reverse();
    for dir in on_the_way {
        let meta = fs::metadata(dir).map_err(io_err("reading", dir))?;
        if !can_search(&meta, uid, &groups) {
            let owner = User::from_uid(Uid::from_raw(meta.uid()))
                .ok()
                .flatten()
                .map_or_else(|| meta.uid().to_string(), |u| u.name);
            return Err(EmbeddedError::Unsearchable {
                dir: dir.to_path_buf(),
                mode: meta.mode() & 0o7777,
                owner,
                user: user.map_or_else(|| uid.to_string(), |u| u.name),
                data_dir: absolute,
            });
        }
    }
    Ok(())
}

fn can_search(meta: &fs::Metadata, uid: Uid, groups: &[Gid]) -> bool {
    let mode = meta.mode();
    if meta.uid() == uid.as_raw() {
        mode & 0o100 != 0
    } else if groups.iter().any(|g| g.as_raw() == meta.gid()) {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OTHER: (u32, u32) = (65534, 65534);

    #[test]
    fn a_data_dir_under_a_directory_postgres_cannot_search_is_refused_naming_it() {
        let top = tempfile::Builder::new()
            .prefix("sf-tmp-reach-")
            .tempdir()
            .unwrap();
        let closed = top.path().join("closed");
        fs::create_dir_all(closed.join("open")).unwrap();
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
        let data = closed.join("open/not-yet/data");
        let (uid, gid) = (Uid::from_raw(OTHER.0), Gid::from_raw(OTHER.1));

        let err = check_reachable(&data, uid, gid).unwrap_err();
        let closed = fs::canonicalize(&closed).unwrap();
        match &err {
            EmbeddedError::Unsearchable { dir, mode, .. } => {
                assert_eq!(dir, &closed, "the first directory it cannot enter");
                assert_eq!(*mode, 0o700);
            }
            other => panic!("{other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains(&format!("`chmod o+x {}`", closed.display())),
            "{message}"
        );
        assert!(message.contains("--data-dir"), "{message}");

        fs::set_permissions(&closed, fs::Permissions::from_mode(0o711)).unwrap();
        check_reachable(&data, uid, gid).expect("searchable now");
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o710)).unwrap();
        let meta = fs::metadata(&closed).unwrap();
        assert!(can_search(&meta, uid, &[Gid::from_raw(meta.gid())]));
        assert!(!can_search(&meta, uid, &[gid]));
        assert!(can_search(&meta, Uid::from_raw(meta.uid()), &[]));
    }
}
