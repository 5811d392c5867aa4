//! `FILE.h5:/dataset`, the source of `strom topic load`, parsed strictly:
//! the file is everything before the one `:/` in the argument, the dataset
//! path everything after the `:`. Pure computation, no HDF5, so the rules
//! are unit-tested without the library.

use std::path::PathBuf;

/// A file and the absolute path of a dataset inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub file: PathBuf,
    /// Absolute, normalized: `/group/dataset`.
    pub dataset: String,
}

/// Why a source argument is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("'{0}': expected FILE:/DATASET (for example data.h5:/entry/temps)")]
    NoSeparator(String),
    #[error("'{0}': more than one ':/', so it is ambiguous where the file name ends")]
    Ambiguous(String),
    #[error("'{0}': the file name before ':/' is empty")]
    EmptyFile(String),
    #[error("'{arg}': dataset path '{path}' {why}")]
    BadPath {
        arg: String,
        path: String,
        why: &'static str,
    },
}

impl Source {
    /// Parses `FILE:/DATASET`.
    pub fn parse(arg: &str) -> Result<Source, SourceError> {
        let mut found = arg.match_indices(":/");
        let Some((at, _)) = found.next() else {
            return Err(SourceError::NoSeparator(arg.into()));
        };
        if found.next().is_some() {
            return Err(SourceError::Ambiguous(arg.into()));
        }
        let (file, path) = (&arg[..at], &arg[at + 1..]);
        if file.is_empty() {
            return Err(SourceError::EmptyFile(arg.into()));
        }
        let bad = |why| SourceError::BadPath {
            arg: arg.into(),
            path: path.into(),
            why,
        };
        if path == "/" {
            return Err(bad("is the root group, not a dataset"));
        }
        if path.ends_with('/') {
            return Err(bad("ends with '/'"));
        }
        if path.chars().any(char::is_control) {
            return Err(bad("contains a control character"));
        }
        for part in path[1..].split('/') {
            match part {
                "" => return Err(bad("has an empty component ('//')")),
                "." | ".." => return Err(bad("has a '.' or '..' component")),
                _ => {}
            }
        }
        Ok(Source {
            file: PathBuf::from(file),
            dataset: path.to_string(),
        })
    }

    /// The dataset path's components, in order (the loader walks them; it
    /// needs the `hdf5` feature).
    #[cfg_attr(not(feature = "hdf5"), allow(dead_code))]
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.dataset[1..].split('/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_and_an_absolute_dataset_path_parse() {
        let s = Source::parse("data.h5:/temps").expect("valid");
        assert_eq!(s.file, PathBuf::from("data.h5"));
        assert_eq!(s.dataset, "/temps");
        let s = Source::parse("/scratch/run 1/x.h5:/entry/data/frames").expect("valid");
        assert_eq!(s.file, PathBuf::from("/scratch/run 1/x.h5"));
        assert_eq!(
            s.components().collect::<Vec<_>>(),
            ["entry", "data", "frames"]
        );
        let s = Source::parse("c:x.h5:/d").expect("a colon not before '/' is part of the name");
        assert_eq!(s.file, PathBuf::from("c:x.h5"));
    }

    #[test]
    fn malformed_sources_are_refused_with_the_reason() {
        let cases = [
            ("data.h5", "expected FILE:/DATASET"),
            ("data.h5:temps", "expected FILE:/DATASET"),
            ("", "expected FILE:/DATASET"),
            (":/temps", "file name before ':/' is empty"),
            ("a:/b.h5:/d", "more than one ':/'"),
            ("data.h5:/", "root group"),
            ("data.h5:/a/", "ends with '/'"),
            ("data.h5:/a//b", "empty component"),
            ("data.h5:/a/../b", "'..' component"),
            ("data.h5:/./b", "a '.' or '..' component"),
            ("data.h5:/a\0b", "control character"),
            ("data.h5:/a\nb", "control character"),
        ];
        for (arg, want) in cases {
            let e = Source::parse(arg).expect_err(arg).to_string();
            assert!(e.contains(want), "{arg:?}: {e}");
        }
    }
}
