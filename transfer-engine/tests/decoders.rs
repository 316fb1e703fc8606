//! Arbitrary bytes into every decoder a peer can reach: control frames and
//! messages, the first-message classifier of admission, attach headers,
//! disk-mode block frames and disk messages, the stats API's JSON. None
//! may panic, and none may allocate more than a small multiple of what it
//! was given: a header that announces a large frame costs nothing until the
//! frame's bytes arrive (a stranger must not make the server allocate a
//! megabyte with nine bytes).
//!
//! A counting allocator measures each decode's peak allocation on the
//! decoding thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use longhaul_engine::attach::{AttachHeader, ATTACH_LEN};
use longhaul_engine::frame::{Frame, FRAME_MAGIC, MAX_FRAME_LEN};
use longhaul_engine::handshake::{classify, MAX_HANDSHAKE_FRAME};
use longhaul_engine::messages::Message;
use longhaul_engine::planes::disk::{
    decode_disk_message, read_header, FrameHeader, FRAME_HEADER_LEN,
};
use proptest::prelude::*;

struct Counting;

thread_local! {
    static NOW: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = NOW.try_with(|n| {
            let v = n.get() + layout.size();
            n.set(v);
            let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
        });
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = NOW.try_with(|n| n.set(n.get().saturating_sub(layout.size())));
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns the most it allocated at once beyond what was
/// allocated before.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = NOW.with(Cell::get);
    PEAK.with(|p| p.set(base));
    f();
    PEAK.with(Cell::get) - base
}

/// What decoding `n` bytes may allocate at most: JSON trees take a few
/// times their text, plus a fixed allowance for buffers and error text.
fn budget(n: usize) -> usize {
    64 * 1024 + 16 * n
}

/// Arbitrary bytes, and bytes that start like each protocol's header (so
/// the length and type paths are reached, not only the magic check).
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    let header = |magic: Vec<u8>| {
        (
            any::<u8>(),
            prop_oneof![
                Just(u32::MAX),
                Just(MAX_FRAME_LEN as u32),
                any::<u32>(),
                0u32..512
            ],
            proptest::collection::vec(any::<u8>(), 0..512),
        )
            .prop_map(move |(kind, len, tail)| {
                let mut v = magic.clone();
                v.push(kind);
                v.extend_from_slice(&len.to_be_bytes());
                v.extend_from_slice(&tail);
                v
            })
    };
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..2048),
        header(FRAME_MAGIC.to_vec()),
        header(b"LHDA".to_vec()),
        // Disk block frames: magic (LE), kind, then arbitrary fields.
        proptest::collection::vec(any::<u8>(), 28..256).prop_map(|mut v| {
            v[..4].copy_from_slice(&longhaul_engine::planes::disk::FRAME_MAGIC.to_le_bytes());
            v
        }),
        // JSON-looking payloads.
        "[{}\\[\\]\":,a-z0-9 ]{0,512}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn control_frames_and_messages(bytes in hostile_bytes()) {
        let n = bytes.len();
        let peak = peak_of(|| {
            for max in [MAX_FRAME_LEN, MAX_HANDSHAKE_FRAME] {
                if let Ok(Some(frame)) = Frame::read_limited(&mut &bytes[..], max) {
                    let _ = Message::from_frame(&frame);
                }
            }
            let _ = Frame::read_from(&mut &bytes[..]);
        });
        prop_assert!(peak <= budget(n), "{peak} bytes allocated for {n} bytes of input");
    }

    #[test]
    fn every_message_type_with_any_payload(kind in any::<u8>(), payload in hostile_bytes()) {
        let n = payload.len();
        let frame = Frame { kind, payload };
        let peak = peak_of(|| {
            if let Ok(Message::ModeData(v)) = Message::from_frame(&frame) {
                let _ = decode_disk_message(v);
            }
        });
        prop_assert!(peak <= budget(n), "{peak} bytes allocated for {n} bytes of input");
    }

    #[test]
    fn first_messages_and_attach_headers(bytes in hostile_bytes()) {
        let n = bytes.len();
        let peak = peak_of(|| {
            for end in [0, 1, 4, 9, bytes.len() / 2, bytes.len()] {
                let _ = classify(&bytes[..end.min(bytes.len())]);
            }
            if bytes.len() >= ATTACH_LEN {
                let header: [u8; ATTACH_LEN] = bytes[..ATTACH_LEN].try_into().unwrap();
                if let Ok(h) = AttachHeader::decode(&header) {
                    let _ = h.verify(b"key");
                }
            }
        });
        prop_assert!(peak <= budget(n), "{peak} bytes allocated for {n} bytes of input");
    }

    #[test]
    fn disk_block_frames(bytes in hostile_bytes()) {
        let n = bytes.len();
        let peak = peak_of(|| {
            let mut r = &bytes[..];
            while let Ok(Some(h)) = read_header(&mut r) {
                let skip = h.payload_len().min(r.len());
                r = &r[skip..];
            }
            if bytes.len() >= FRAME_HEADER_LEN {
                let b: [u8; FRAME_HEADER_LEN] = bytes[..FRAME_HEADER_LEN].try_into().unwrap();
                let _ = FrameHeader::decode(&b);
            }
        });
        prop_assert!(peak <= budget(n), "{peak} bytes allocated for {n} bytes of input");
    }

    #[test]
    fn stats_api_snapshots(bytes in hostile_bytes()) {
        let n = bytes.len();
        let peak = peak_of(|| {
            let _ = serde_json::from_slice::<longhaul_stats_api::Snapshot>(&bytes);
        });
        prop_assert!(peak <= budget(n), "{peak} bytes allocated for {n} bytes of input");
    }
}

/// The case that matters most, spelled out: nine bytes announcing a frame
/// at the limit make no megabyte allocation.
#[test]
fn a_header_announcing_a_large_frame_allocates_nothing_large() {
    let mut bytes = FRAME_MAGIC.to_vec();
    bytes.push(1);
    bytes.extend_from_slice(&(MAX_FRAME_LEN as u32).to_be_bytes());
    bytes.extend_from_slice(b"{\"a\":");
    let peak = peak_of(|| {
        assert!(Frame::read_from(&mut &bytes[..]).is_err());
    });
    assert!(peak < 64 * 1024, "{peak} bytes allocated");
}
