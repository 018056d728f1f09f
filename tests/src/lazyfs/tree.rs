//! The inode table of a lazyfs mount: which backing path each inode number stands for.
//!
//! An inode is either the root, an entry `(parent, name)` of a directory, or a file that was
//! unlinked (or replaced by a rename) and now lives in the trash until that change is durable.
//! Inode numbers are never reused, so a number the kernel still holds after a crash finds
//! nothing instead of another file.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

/// The root directory's inode number (FUSE's `FUSE_ROOT_ID`).
pub(super) const ROOT: u64 = 1;

/// Where an inode's bytes are in the backing directory.
#[derive(Debug, Clone)]
enum Loc {
    Root,
    Entry { parent: u64, name: OsString },
    Trash(PathBuf),
}

#[derive(Debug)]
struct Node {
    loc: Loc,
    dir: bool,
}

/// Inode numbers to backing paths.
#[derive(Debug)]
pub(super) struct Tree {
    root: PathBuf,
    nodes: HashMap<u64, Node>,
    by_name: HashMap<(u64, OsString), u64>,
    next: u64,
}

fn gone() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl Tree {
    /// A table holding only the root, which is `root` in the backing file system.
    pub(super) fn new(root: PathBuf) -> Tree {
        let mut tree = Tree {
            root,
            nodes: HashMap::new(),
            by_name: HashMap::new(),
            next: ROOT + 1,
        };
        tree.reset();
        tree
    }

    /// Forgets every inode but the root (after a crash); numbers keep growing.
    pub(super) fn reset(&mut self) {
        self.nodes.clear();
        self.by_name.clear();
        self.nodes.insert(
            ROOT,
            Node {
                loc: Loc::Root,
                dir: true,
            },
        );
    }

    /// The backing path of `ino`.
    pub(super) fn path(&self, ino: u64) -> io::Result<PathBuf> {
        let mut names = Vec::new();
        let mut cur = ino;
        loop {
            match &self.nodes.get(&cur).ok_or_else(gone)?.loc {
                Loc::Root => break,
                Loc::Trash(p) => {
                    if cur != ino {
                        return Err(gone());
                    }
                    return Ok(p.clone());
                }
                Loc::Entry { parent, name } => {
                    names.push(name.clone());
                    cur = *parent;
                }
            }
            if names.len() > 4096 {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
        }
        let mut p = self.root.clone();
        p.extend(names.iter().rev());
        Ok(p)
    }

    /// The backing path of entry `name` of directory `parent` (which may not exist).
    pub(super) fn child_path(&self, parent: u64, name: &OsStr) -> io::Result<PathBuf> {
        Ok(self.path(parent)?.join(name))
    }

    /// The inode of entry `name` of `parent`, if it has one.
    pub(super) fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.by_name.get(&(parent, name.to_os_string())).copied()
    }

    /// The inode of entry `name` of `parent`, numbering it on first sight.
    pub(super) fn child_or_insert(&mut self, parent: u64, name: &OsStr, dir: bool) -> u64 {
        if let Some(ino) = self.child(parent, name) {
            return ino;
        }
        self.insert(parent, name, dir)
    }

    /// A new inode for entry `name` of `parent`.
    pub(super) fn insert(&mut self, parent: u64, name: &OsStr, dir: bool) -> u64 {
        let ino = self.next;
        self.next += 1;
        let loc = Loc::Entry {
            parent,
            name: name.to_os_string(),
        };
        self.nodes.insert(ino, Node { loc, dir });
        self.by_name.insert((parent, name.to_os_string()), ino);
        ino
    }

    /// True if `ino` is a directory.
    pub(super) fn is_dir(&self, ino: u64) -> bool {
        self.nodes.get(&ino).is_some_and(|n| n.dir)
    }

    fn unlink_name(&mut self, ino: u64) {
        if let Some(Node {
            loc: Loc::Entry { parent, name },
            ..
        }) = self.nodes.get(&ino)
        {
            let key = (*parent, name.clone());
            if self.by_name.get(&key) == Some(&ino) {
                self.by_name.remove(&key);
            }
        }
    }

    /// `ino` now lives at `trash` (unlinked or replaced).
    pub(super) fn move_to_trash(&mut self, ino: u64, trash: &Path) {
        self.unlink_name(ino);
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.loc = Loc::Trash(trash.to_path_buf());
        }
    }

    /// `ino` is now entry `name` of `parent` (renamed or restored).
    pub(super) fn move_to(&mut self, ino: u64, parent: u64, name: &OsStr) {
        self.unlink_name(ino);
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.loc = Loc::Entry {
                parent,
                name: name.to_os_string(),
            };
            self.by_name.insert((parent, name.to_os_string()), ino);
        }
    }

    /// Forgets `ino` (its creation was undone).
    pub(super) fn remove(&mut self, ino: u64) {
        self.unlink_name(ino);
        self.nodes.remove(&ino);
    }
}
