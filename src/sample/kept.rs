//! A kernel file kept open and read again from its start (pread) on each call, instead of opened,
//! read and closed: procfs and cgroupfs generate the text afresh on every read at offset 0. A file
//! not on such a filesystem (a fixture tree, whose files tests replace) is opened afresh each time
//! and read in order, as any file (or pipe) can be.

use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::error::ReadError;

/// The most a kept file's text may grow to.
const MAX_BYTES: usize = 1 << 20;

/// One file, kept open where it lies on procfs or a cgroup filesystem.
pub struct KeptFile {
    path: PathBuf,
    file: Option<std::fs::File>,
    keep: bool,
    buf: Vec<u8>,
    text: String,
}

impl KeptFile {
    /// Opens nothing yet: the first read does.
    pub fn new(path: PathBuf) -> Self {
        KeptFile {
            keep: regenerated_at_zero(&path),
            path,
            file: None,
            buf: Vec::with_capacity(4096),
            text: String::new(),
        }
    }

    /// Whether a descriptor is held between reads.
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// The file's path and its whole text now; after an error the next call opens it again.
    pub fn read(&mut self) -> Result<(&Path, &str), ReadError> {
        let r = self.read_once();
        if r.is_err() || !self.keep {
            self.file = None;
        }
        r?;
        Ok((&self.path, &self.text))
    }

    fn read_once(&mut self) -> Result<(), ReadError> {
        let io = |source| ReadError::Io {
            path: self.path.clone(),
            source,
        };
        let file = match &mut self.file {
            Some(f) => f,
            None => self
                .file
                .insert(std::fs::File::open(&self.path).map_err(io)?),
        };
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        while self.buf.len() < MAX_BYTES {
            let n = if self.keep {
                file.read_at(&mut chunk, self.buf.len() as u64)
            } else {
                std::io::Read::read(file, &mut chunk)
            }
            .map_err(io)?;
            if n == 0 {
                break;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        self.text.clear();
        self.text.push_str(
            std::str::from_utf8(&self.buf)
                .map_err(|_| ReadError::parse(&self.path, "not UTF-8 text"))?,
        );
        Ok(())
    }
}

const PROC: i64 = 0x9fa0;
const CGROUP: i64 = 0x27e0eb;
const CGROUP2: i64 = 0x6367_7270;
const SYSFS: i64 = 0x6265_6572;

/// The filesystem type of the one `path` lies on.
fn fs_type(path: &Path) -> Option<i64> {
    nix::sys::statfs::statfs(path).ok().map(|s| {
        #[allow(clippy::unnecessary_cast)] // the field is i64 on some targets, i32 or u32 on others
        let t = s.filesystem_type().0 as i64;
        t
    })
}

/// Whether `path` lies on procfs or a cgroup filesystem, where writing a trigger is a request to the
/// kernel (and not, as on a fixture tree, an edit of a file).
pub fn on_kernel_fs(path: &Path) -> bool {
    fs_type(path).is_some_and(|t| t == PROC || t == CGROUP || t == CGROUP2)
}

/// Whether a read of `path` at offset 0 makes the kernel write its text afresh: procfs, cgroupfs
/// and sysfs (whose attributes, a hwmon sensor's reading among them, are shown again from the
/// start).
fn regenerated_at_zero(path: &Path) -> bool {
    fs_type(path).is_some_and(|t| t == PROC || t == CGROUP || t == CGROUP2 || t == SYSFS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_file_is_kept_open_and_read_whole_each_time() {
        let mut f = KeptFile::new(PathBuf::from("/proc/vmstat"));
        let mut lens = Vec::new();
        for _ in 0..3 {
            let (_, text) = f.read().unwrap();
            assert!(text.contains("\nnr_free_pages ") || text.starts_with("nr_free_pages "));
            assert!(text.ends_with('\n'), "read to its end");
            lens.push(text.lines().count());
        }
        assert!(f.is_open());
        assert!(lens.iter().all(|n| *n == lens[0]), "{lens:?}");
    }

    /// sysfs shows an attribute afresh when it is read again from offset 0 (a hwmon sensor's
    /// reading is kept open so): loopback's packet count, read before and after packets sent.
    #[test]
    fn a_sysfs_attribute_is_kept_open_and_shows_its_new_value() {
        let path = PathBuf::from("/sys/class/net/lo/statistics/rx_packets");
        let mut f = KeptFile::new(path);
        let count = |f: &mut KeptFile| f.read().unwrap().1.trim().parse::<u64>().unwrap();
        let before = count(&mut f);
        assert!(f.is_open(), "a sysfs file is kept open");
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            socket.send_to(b"x", socket.local_addr().unwrap()).unwrap();
        }
        assert!(count(&mut f) >= before + 3);
        assert!(f.is_open());
    }

    #[test]
    fn a_fixture_file_is_opened_afresh_and_a_missing_one_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let put = |text: &str| {
            std::fs::write(dir.path().join("f.new"), text).unwrap();
            std::fs::rename(dir.path().join("f.new"), &path).unwrap();
        };
        let mut f = KeptFile::new(path.clone());
        put("one\n");
        assert_eq!(f.read().unwrap().1, "one\n");
        put("two\n");
        assert_eq!(f.read().unwrap().1, "two\n");
        assert!(!f.is_open());
        std::fs::remove_file(&path).unwrap();
        let e = f.read().unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    /// A fixture file that is a pipe (as a test's hung sampler uses) is read in order until its
    /// writer closes it, not given up at once because a pipe has no offsets.
    #[test]
    fn a_fixture_pipe_is_read_until_its_writer_closes() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut w = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                w.write_all(b"nr_free_pages 1\n").unwrap();
                w.write_all(b"pgfault 2\n").unwrap();
            })
        };
        let mut f = KeptFile::new(path);
        assert_eq!(f.read().unwrap().1, "nr_free_pages 1\npgfault 2\n");
        writer.join().unwrap();
    }
}
