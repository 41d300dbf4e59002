//! A vector stored in copy-on-write chunks: cloning it shares every chunk, and a write
//! copies only the chunk it lands in (when another clone still shares it). The busy set
//! keeps its per-member refusal details in these, so a publication that changed a few
//! members copies a few chunks, not the whole fleet's entries.

use std::sync::Arc;

/// Entries per chunk.
const CHUNK: usize = 64;

/// Entries of `T`, `T::default()` where never set.
#[derive(Debug, Clone, Default)]
pub struct CowChunks<T> {
    chunks: Vec<Arc<[T; CHUNK]>>,
}

impl<T: Copy + Default + PartialEq> CowChunks<T> {
    /// The entry at `i` (the default past the end).
    #[inline]
    pub fn get(&self, i: usize) -> T {
        self.chunks
            .get(i / CHUNK)
            .map_or_else(T::default, |c| c[i % CHUNK])
    }

    /// Sets the entry at `i`, copying its chunk first if it is shared.
    pub fn set(&mut self, i: usize, value: T) {
        let c = i / CHUNK;
        if self.chunks.len() <= c {
            if value == T::default() {
                return;
            }
            self.chunks
                .resize_with(c + 1, || Arc::new([T::default(); CHUNK]));
        }
        let chunk = &mut self.chunks[c];
        if chunk[i % CHUNK] != value {
            Arc::make_mut(chunk)[i % CHUNK] = value;
        }
    }

    /// Every entry back to the default, keeping chunks it owns alone and dropping its
    /// share of the others (nothing is copied).
    pub fn clear(&mut self) {
        for chunk in &mut self.chunks {
            if chunk.iter().all(|v| *v == T::default()) {
                continue;
            }
            match Arc::get_mut(chunk) {
                Some(owned) => owned.fill(T::default()),
                None => *chunk = Arc::new([T::default(); CHUNK]),
            }
        }
    }
}

impl<T: Copy + Default + PartialEq> PartialEq for CowChunks<T> {
    /// Same entries (missing chunks read as defaults); shared chunks are not compared.
    fn eq(&self, other: &Self) -> bool {
        let n = self.chunks.len().max(other.chunks.len());
        (0..n).all(|c| match (self.chunks.get(c), other.chunks.get(c)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            (Some(x), None) | (None, Some(x)) => x.iter().all(|v| *v == T::default()),
            (None, None) => true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_defaults_elsewhere() {
        let mut v = CowChunks::<u32>::default();
        assert_eq!(v.get(1000), 0);
        v.set(3, 7);
        v.set(130, 9);
        assert_eq!(
            (v.get(3), v.get(130), v.get(4), v.get(10_000)),
            (7, 9, 0, 0)
        );
        v.set(5000, 0);
        assert_eq!(
            v.chunks.len(),
            3,
            "setting a default past the end grows nothing"
        );
    }

    #[test]
    fn a_clone_shares_chunks_until_one_is_written() {
        let mut a = CowChunks::<u32>::default();
        for i in 0..256 {
            a.set(i, i as u32 + 1);
        }
        let mut b = a.clone();
        b.set(70, 0);
        assert_eq!(
            (a.get(70), b.get(70)),
            (71, 0),
            "the original keeps its entry"
        );
        let shared = (0..4)
            .filter(|&c| Arc::ptr_eq(&a.chunks[c], &b.chunks[c]))
            .count();
        assert_eq!(shared, 3, "only the written chunk was copied");
        assert_ne!(a, b);
        b.set(70, 71);
        assert_eq!(a, b, "equal by content, not by sharing");
    }

    #[test]
    fn clear_leaves_clones_alone_and_compares_equal_to_empty() {
        let mut a = CowChunks::<u32>::default();
        a.set(1, 1);
        a.set(100, 2);
        let b = a.clone();
        a.clear();
        assert_eq!((b.get(1), b.get(100)), (1, 2));
        assert_eq!(a, CowChunks::default());
        assert_ne!(b, CowChunks::default());
    }
}
