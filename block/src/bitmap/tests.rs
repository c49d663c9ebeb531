use std::sync::Arc;

use super::*;

const KIB: u64 = 1024;

#[test]
fn a_write_dirties_every_chunk_it_touches_and_count_counts_whole_chunks() {
    let b = DirtyBitmap::new("b", 1 << 20, 64 << 10).unwrap();
    assert_eq!(b.count(), 0);
    b.set(60 * KIB, 8 * KIB); // chunks 0 and 1
    assert!(b.is_dirty(0) && b.is_dirty(64 * KIB) && !b.is_dirty(128 * KIB));
    assert_eq!(b.count(), 128 * KIB);
    // Past the end: clipped, nothing set out there.
    b.set((1 << 20) - 512, 4096);
    assert!(b.is_dirty((1 << 20) - 1));
    assert_eq!(b.count(), 3 * 64 * KIB);
    b.set(0, 0);
    assert_eq!(b.count(), 3 * 64 * KIB);
}

#[test]
fn extents_cover_the_range_in_runs_of_one_state() {
    let b = DirtyBitmap::new("b", 1 << 20, 64 << 10).unwrap();
    b.set(64 * KIB, 1);
    b.set(128 * KIB, 1);
    let e = b.extents(0, 1 << 20);
    assert_eq!(
        e,
        vec![
            (0, 64 * KIB, false),
            (64 * KIB, 128 * KIB, true),
            (192 * KIB, (1 << 20) - 192 * KIB, false)
        ]
    );
    // A range cutting chunks keeps its own ends.
    assert_eq!(
        b.extents(100 * KIB, 10 * KIB),
        vec![(100 * KIB, 10 * KIB, true)]
    );
}

#[test]
fn reset_clears_only_whole_chunks_but_the_images_last_partial_one() {
    let size = 200 * KIB; // four chunks, the last one 8 KiB
    let b = DirtyBitmap::new("b", size, 64 << 10).unwrap();
    b.set(0, size);
    b.reset(32 * KIB, 64 * KIB); // chunk 0 and 1 only partly inside: unchanged
    assert_eq!(b.count(), 4 * 64 * KIB);
    b.reset(64 * KIB, 64 * KIB);
    assert!(!b.is_dirty(64 * KIB));
    b.reset(192 * KIB, 8 * KIB); // to the end: the last chunk is cleared
    assert!(!b.is_dirty(195 * KIB));
    assert_eq!(b.count(), 2 * 64 * KIB);
    b.clear();
    assert_eq!(b.count(), 0);
}

#[test]
fn words_span_the_whole_bitmap_and_more_than_one() {
    // 200 chunks: four words; a write over all of it sets exactly 200 bits.
    let b = DirtyBitmap::new("b", 200 * 512, 512).unwrap();
    b.set(0, 200 * 512);
    let w = b.to_words();
    assert_eq!(w.len(), 4);
    assert_eq!(w.iter().map(|w| w.count_ones()).sum::<u32>(), 200);
    assert_eq!(w[3], (1 << 8) - 1);
}

#[test]
fn granularity_follows_qemus_rule_and_refuses_what_qemu_refuses() {
    assert_eq!(default_granularity(None), 65536);
    assert_eq!(default_granularity(Some(512)), 4096);
    assert_eq!(default_granularity(Some(65536)), 65536);
    assert_eq!(default_granularity(Some(2 << 20)), 65536);
    assert_eq!(default_granularity(Some(16384)), 16384);
    for bad in [0, 256, 3000, 4097] {
        assert_eq!(check_granularity(bad), Err(BitmapError::Granularity));
    }
    assert_eq!(
        DirtyBitmap::new("b", 1 << 20, 1000)
            .unwrap_err()
            .to_string(),
        "Granularity must be power of 2 and at least 512"
    );
    assert_eq!(
        DirtyBitmap::new("", 1, 512).unwrap_err().to_string(),
        "Bitmap name cannot be empty"
    );
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    assert!(matches!(
        DirtyBitmap::new(&long, 1, 512),
        Err(BitmapError::NameTooLong(_))
    ));
}

#[test]
fn merge_ors_bits_in_across_granularities_and_refuses_other_sizes() {
    let a = DirtyBitmap::new("a", 1 << 20, 64 << 10).unwrap();
    let fine = DirtyBitmap::new("fine", 1 << 20, 4096).unwrap();
    fine.set(130 * KIB, 1);
    a.merge_from(&fine).unwrap();
    assert_eq!(a.extents(0, 1 << 20)[1], (128 * KIB, 64 * KIB, true));
    let same = DirtyBitmap::new("same", 1 << 20, 64 << 10).unwrap();
    same.set(0, 1);
    a.merge_from(&same).unwrap();
    assert_eq!(a.count(), 128 * KIB);
    let other = DirtyBitmap::new("other", 2 << 20, 64 << 10).unwrap();
    let e = a.merge_from(&other).unwrap_err();
    assert!(e.to_string().contains("and can't be merged"), "{e}");
}

#[test]
fn resize_keeps_bits_inside_and_grows_clean() {
    let b = DirtyBitmap::new("b", 1 << 20, 64 << 10).unwrap();
    b.set(0, 1 << 20);
    b.resize(512 * KIB);
    assert_eq!(b.count(), 512 * KIB);
    b.resize(4 << 20);
    assert_eq!(b.count(), 512 * KIB);
    assert!(!b.is_dirty(600 * KIB));
    assert_eq!(b.size(), 4 << 20);
}

#[test]
fn the_sha256_is_of_qemus_layout() {
    // 1 GiB at 64 KiB: 16384 chunks, 256 words, 2048 zero bytes (QEMU's hash of an empty
    // bitmap of that shape; `sha256sum` of 2048 zero bytes).
    let b = DirtyBitmap::new("b", 1 << 30, 64 << 10).unwrap();
    assert_eq!(
        b.sha256_hex(),
        "e5a00aa9991ac8a5ee3109844d84a55583bd20572ad3ffcd42792f3c36b183ad"
    );
    b.set(0, 1);
    assert_ne!(
        b.sha256_hex(),
        "e5a00aa9991ac8a5ee3109844d84a55583bd20572ad3ffcd42792f3c36b183ad"
    );
}

#[test]
fn busy_read_only_and_inconsistent_bitmaps_refuse_changes_with_qemus_texts() {
    let b = Arc::new(DirtyBitmap::new("b", 1 << 20, 65536).unwrap());
    let guard = b.hold_busy().unwrap();
    assert!(b.is_busy());
    assert_eq!(
        b.set_recording(false).unwrap_err().to_string(),
        "Bitmap 'b' is currently in use by another operation and cannot be used"
    );
    assert!(matches!(b.hold_busy(), Err(BitmapError::Busy(_))));
    drop(guard);
    assert!(!b.is_busy());
    b.set_read_only(true);
    assert_eq!(
        b.check_writable().unwrap_err().to_string(),
        "Bitmap 'b' is readonly and cannot be modified"
    );
    // QEMU enables and disables a read-only bitmap (`BDRV_BITMAP_ALLOW_RO`).
    b.set_recording(false).unwrap();
    assert!(!b.is_recording());
    b.set_recording(true).unwrap();
    b.set_read_only(false);
    b.set_inconsistent();
    assert!(!b.is_recording());
    let e = b.check_usable().unwrap_err();
    assert_eq!(
        e.to_string(),
        "Bitmap 'b' is inconsistent and cannot be used"
    );
    assert!(e.hint().is_some());
}

/// What `Image::add_dirty_bitmap` does with the set: make, then insert.
fn add(
    set: &BitmapSet,
    name: &str,
    size: (u64, u32),
    options: BitmapOptions,
    node: (bool, &str),
) -> Result<Arc<DirtyBitmap>, BitmapError> {
    let bitmap = BitmapSet::make(name, size, options, node)?;
    set.insert(bitmap.clone())?;
    Ok(bitmap)
}

#[test]
fn the_set_dirties_only_recording_bitmaps_and_removes_what_is_not_busy() {
    let set = BitmapSet::new();
    assert!(set.is_empty());
    let node = (false, "disk");
    let on = add(&set, "on", (1 << 20, 65536), BitmapOptions::new(), node).unwrap();
    let off = add(
        &set,
        "off",
        (1 << 20, 65536),
        BitmapOptions::new().disabled(true),
        node,
    )
    .unwrap();
    assert_eq!(
        add(&set, "on", (1 << 20, 65536), BitmapOptions::new(), node)
            .unwrap_err()
            .to_string(),
        "Bitmap already exists: on"
    );
    let e = add(
        &set,
        "p",
        (1 << 20, 65536),
        BitmapOptions::new().persistent(true),
        node,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Can't store persistent bitmaps to disk: Operation not supported"
    );
    set.mark(0, 4096);
    assert_eq!((on.count(), off.count()), (65536, 0));
    let g = on.hold_busy().unwrap();
    assert!(matches!(set.remove("on"), Err(BitmapError::Busy(_))));
    drop(g);
    set.remove("on").unwrap();
    assert_eq!(
        set.remove("on").unwrap_err().to_string(),
        "Dirty bitmap 'on' not found"
    );
    assert_eq!(set.list().len(), 1);
}

#[test]
fn iothreads_dirtying_one_word_lose_no_bit() {
    let b = Arc::new(DirtyBitmap::new("b", 64 * 512, 512).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                for chunk in (t..64).step_by(4) {
                    b.set(chunk * 512, 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(b.to_words(), vec![u64::MAX]);
}

#[test]
fn a_bitmap_held_for_removal_refuses_other_users_and_an_inconsistent_one_may_be_held() {
    let b = Arc::new(DirtyBitmap::new("b", 1 << 20, 65536).unwrap());
    let guard = b.hold_for_removal().unwrap();
    assert!(matches!(b.check_writable(), Err(BitmapError::Busy(_))));
    assert!(matches!(b.hold_for_removal(), Err(BitmapError::Busy(_))));
    drop(guard);
    assert!(!b.is_busy());
    b.set_read_only(true);
    assert_eq!(
        b.hold_for_removal().unwrap_err().to_string(),
        "Bitmap 'b' is readonly and cannot be modified"
    );
    assert!(!b.is_busy(), "a refused hold holds nothing");
    b.set_read_only(false);
    b.set_inconsistent();
    let held = b.hold_for_removal().unwrap();
    assert!(b.is_busy());
    drop(held);
}
