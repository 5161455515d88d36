//! Cutting a batch into near-equal runs of rows, one per thread: the gradient shards of a
//! training step, the runs of a threaded policy call.

/// Row ranges of `shards` near-equal shards of `batch` rows (earlier shards get the extra rows).
pub fn shard_ranges(batch: usize, shards: usize) -> Vec<std::ops::Range<usize>> {
    let shards = shards.clamp(1, batch.max(1));
    let (q, r) = (batch / shards, batch % shards);
    let mut start = 0;
    (0..shards)
        .map(|i| {
            let len = q + usize::from(i < r);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_in_order() {
        assert_eq!(shard_ranges(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(shard_ranges(4, 1), vec![0..4]);
        assert_eq!(shard_ranges(2, 8), vec![0..1, 1..2]);
        assert_eq!(shard_ranges(256, 2), vec![0..128, 128..256]);
    }
}
