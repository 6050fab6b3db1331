//! Tests of overlays (moved from `tree/tests.rs`): the changes made in
//! order, and a property over random overlays that a window of a file is
//! that part of the whole file built.

use proptest::prelude::*;

use super::*;

#[test]
fn an_overlay_writes_truncates_and_extends_in_order() {
    let entry = |version, change| OverlayEntry { version, change };
    let overlay = vec![
        entry(
            2,
            OverlayChange::Write {
                offset: 3,
                data: b"XY".to_vec(),
            },
        ),
        entry(3, OverlayChange::Truncate { size: 4 }),
        entry(
            4,
            OverlayChange::Write {
                offset: 6,
                data: b"Z".to_vec(),
            },
        ),
    ];
    assert_eq!(overlaid(b"abcdef".to_vec(), &overlay, 7), b"abcX\0\0Z");
    // The size cuts or extends what the changes left.
    assert_eq!(overlaid(b"abc".to_vec(), &[], 2), b"ab");
    assert_eq!(overlaid(Vec::new(), &[], 2), b"\0\0");
}

fn arb_overlay() -> impl Strategy<Value = Vec<OverlayEntry>> {
    let change = prop_oneof![
        (0u64..64, proptest::collection::vec(any::<u8>(), 0..16))
            .prop_map(|(offset, data)| OverlayChange::Write { offset, data }),
        (0u64..64).prop_map(|size| OverlayChange::Truncate { size }),
    ];
    proptest::collection::vec(change, 0..8).prop_map(|changes| {
        changes
            .into_iter()
            .enumerate()
            .map(|(i, change)| OverlayEntry {
                version: i as u64 + 1,
                change,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A window of a file is the same window of the whole file built.
    #[test]
    fn a_window_is_that_part_of_the_whole(
        base in proptest::collection::vec(any::<u8>(), 0..48),
        overlay in arb_overlay(),
        size in 0u64..80,
        start in 0u64..80,
        len in 0usize..40,
    ) {
        let whole = overlaid(base.clone(), &overlay, size);
        let from = (start as usize).min(whole.len());
        let to = (start as usize).saturating_add(len).min(whole.len());
        let window_base = &base[(start as usize).min(base.len())..];
        prop_assert_eq!(
            overlaid_window(window_base, start, len, &overlay, size),
            whole[from..to.max(from)].to_vec()
        );
    }
}
