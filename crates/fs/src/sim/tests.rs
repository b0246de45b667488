use super::*;
use crate::OsFs;

const ROOT: &str = "/sim/root";

fn fs(seed: u64, faults: DiskFaults) -> SimFs {
    let fs = SimFs::new(ROOT, seed);
    fs.set_faults(faults);
    fs
}

fn p(rel: &str) -> PathBuf {
    Path::new(ROOT).join(rel)
}

fn never() -> DiskFaults {
    DiskFaults {
        page_survives: 0.0,
        torn: false,
        ..DiskFaults::default()
    }
}

/// The same steps on the real file system and on the simulated one give the same answers.
fn common(fs: &dyn Fs, root: &Path) {
    let d = root.join("d");
    fs.create_dir_all(&d.join("e")).expect("mkdir -p");
    assert!(fs.is_dir(&d).expect("is dir"));
    let f = fs.open(&d.join("b"), Mode::Create).expect("create");
    f.write_all_at(b"hello", 0).expect("write");
    f.write_all_at(b"!", 7).expect("write past the end");
    assert_eq!(f.len().expect("len"), 8);
    f.sync_data().expect("sync");
    assert_eq!(fs.read(&d.join("b")).expect("read"), b"hello\0\0!");
    fs.write(&d.join("a"), b"x").expect("write a");
    let names: Vec<_> = fs
        .read_dir(&d)
        .expect("ls")
        .into_iter()
        .map(|e| (e.name, e.is_dir))
        .collect();
    assert_eq!(
        names,
        vec![("a".into(), false), ("b".into(), false), ("e".into(), true)]
    );
    fs.rename(&d.join("a"), &d.join("b")).expect("rename over");
    assert_eq!(fs.read(&d.join("b")).expect("read"), b"x");
    assert_eq!(fs.len(&d.join("b")).expect("len"), 1);
    assert!(fs.open(&d.join("a"), Mode::Read).is_err());
    assert_eq!(
        fs.remove_dir(&d).map_err(|e| e.kind()),
        Err(io::ErrorKind::DirectoryNotEmpty)
    );
    fs.sync_dir(&d).expect("sync dir");
    let g = fs.open(&d.join("b"), Mode::Read).expect("open");
    assert!(g.write_all_at(b"y", 0).is_err(), "read-only");
    let mut two = [0u8; 2];
    assert!(g.read_exact_at(&mut two, 0).is_err(), "past the end");
    fs.remove_dir_all(&d).expect("rm -r");
    assert!(!fs.exists(&d));
    assert_eq!(
        fs.open(&d.join("b"), Mode::Read)
            .map(|_| ())
            .map_err(|e| e.kind()),
        Err(io::ErrorKind::NotFound)
    );
}

#[test]
fn the_simulated_disk_answers_like_the_real_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    common(&OsFs, dir.path());
    common(&SimFs::new(ROOT, 1), Path::new(ROOT));
}

#[test]
fn what_was_synced_survives_a_power_loss_and_nothing_else_does() {
    let fs = fs(7, never());
    fs.create_dir(&p("d")).expect("mkdir");
    fs.sync_dir(Path::new(ROOT)).expect("sync root");
    let f = fs.open(&p("d/log"), Mode::Create).expect("create");
    f.write_all_at(&[1; 10_000], 0).expect("write");
    f.sync_data().expect("sync");
    fs.sync_dir(&p("d")).expect("sync dir");
    f.write_all_at(&[2; 100], 20_000).expect("write more");
    let g = fs.open(&p("d/new"), Mode::Create).expect("create");
    g.write_all_at(b"never synced", 0).expect("write");
    assert_eq!(fs.power_loss().pages_lost, 2);
    let log = fs.read(&p("d/log")).expect("read");
    assert_eq!(log[..10_000], [1; 10_000]);
    // The length change may have reached the disk; the bytes past the synced ones did not.
    assert!(log.len() == 10_000 || log.len() == 20_100);
    assert!(log[10_000..].iter().all(|b| *b == 0));
    assert!(!fs.exists(&p("d/new")), "its name was never synced");
}

#[test]
fn a_process_crash_is_not_a_power_loss() {
    let fs = fs(7, never());
    fs.write(&p("f"), b"cached").expect("write");
    // No power_loss(): a new process opens the same cache.
    assert_eq!(fs.read(&p("f")).expect("read"), b"cached");
}

#[test]
fn a_later_page_can_survive_an_earlier_lost_one() {
    let mut found = None;
    for seed in 0..200 {
        let fs = fs(
            seed,
            DiskFaults {
                torn: false,
                ..DiskFaults::default()
            },
        );
        let f = fs.open(&p("log"), Mode::Create).expect("create");
        f.write_all_at(&[0; 3 * PAGE as usize], 0).expect("zeros");
        f.sync_data().expect("sync");
        fs.sync_dir(Path::new(ROOT)).expect("sync dir");
        f.write_all_at(&[1; PAGE as usize], 0).expect("page 0");
        f.write_all_at(&[2; PAGE as usize], PAGE).expect("page 1");
        fs.power_loss();
        let bytes = fs.read(&p("log")).expect("read");
        if bytes[0] == 0 && bytes[PAGE as usize] == 2 {
            found = Some(seed);
            break;
        }
    }
    assert!(found.is_some(), "no seed lost page 0 and kept page 1");
}

#[test]
fn a_torn_page_keeps_whole_sectors_only() {
    let mut torn = 0;
    for seed in 0..200 {
        let fs = fs(
            seed,
            DiskFaults {
                page_survives: 1.0,
                ..DiskFaults::default()
            },
        );
        let f = fs.open(&p("log"), Mode::Create).expect("create");
        f.write_all_at(&[0; PAGE as usize], 0).expect("zeros");
        f.sync_data().expect("sync");
        fs.sync_dir(Path::new(ROOT)).expect("sync dir");
        f.write_all_at(&[9; PAGE as usize], 0).expect("page");
        if fs.power_loss().pages_torn == 1 {
            torn += 1;
            let bytes = fs.read(&p("log")).expect("read");
            let kept = bytes.iter().take_while(|b| **b == 9).count() as u64;
            assert_eq!(kept % SECTOR, 0, "seed {seed}: cut inside a sector");
            assert!(kept < PAGE && bytes[kept as usize..].iter().all(|b| *b == 0));
        }
    }
    assert!(torn > 0);
}

#[test]
fn a_failed_fsync_forgets_the_pages_it_did_not_write() {
    let fs = fs(
        3,
        DiskFaults {
            fsync_error: 1.0,
            ..never()
        },
    );
    fs.write(&p("f"), b"old").expect("write");
    fs.set_faults(never());
    fs.open(&p("f"), Mode::Write)
        .expect("open")
        .sync_data()
        .expect("sync");
    fs.sync_dir(Path::new(ROOT)).expect("sync dir");
    fs.set_faults(DiskFaults {
        fsync_error: 1.0,
        ..never()
    });
    let f = fs.open(&p("f"), Mode::Write).expect("open");
    f.write_all_at(b"new", 0).expect("write");
    assert_eq!(
        f.sync_data().map_err(|e| e.raw_os_error()),
        Err(Some(IO_ERROR))
    );
    fs.set_faults(never());
    // The cache still shows it, and a second sync "succeeds" ...
    assert_eq!(fs.read(&p("f")).expect("read"), b"new");
    f.sync_data().expect("sync");
    // ... but the disk never got it.
    fs.power_loss();
    assert_eq!(fs.read(&p("f")).expect("read"), b"old");
}

#[test]
fn a_full_disk_refuses_new_space_only() {
    let fs = fs(3, never());
    let f = fs.open(&p("f"), Mode::Create).expect("create");
    f.write_all_at(&[0; 100], 0).expect("write");
    fs.set_faults(DiskFaults {
        full: true,
        ..never()
    });
    f.write_all_at(&[1; 100], 0).expect("overwrite in place");
    assert_eq!(
        f.write_all_at(&[1], 100).map_err(|e| e.raw_os_error()),
        Err(Some(NO_SPACE))
    );
    assert_eq!(
        f.set_len(200).map_err(|e| e.raw_os_error()),
        Err(Some(NO_SPACE))
    );
    f.set_len(50).expect("shrinking needs no space");
}

#[test]
fn a_rename_is_durable_once_its_directory_is_synced() {
    let mut old_seen = false;
    for seed in 0..50 {
        let fs = fs(seed, never());
        fs.write(&p("state"), b"1").expect("write");
        fs.open(&p("state"), Mode::Write)
            .expect("open")
            .sync_all()
            .expect("sync");
        fs.sync_dir(Path::new(ROOT)).expect("sync dir");
        fs.write(&p("state.tmp"), b"2").expect("write tmp");
        fs.open(&p("state.tmp"), Mode::Write)
            .expect("open")
            .sync_all()
            .expect("sync");
        fs.rename(&p("state.tmp"), &p("state")).expect("rename");
        fs.power_loss();
        let now = fs.read(&p("state")).expect("read");
        assert!(now == b"1" || now == b"2", "seed {seed}: {now:?}");
        old_seen |= now == b"1";
        // With the directory synced, the new name always holds.
        fs.write(&p("state.tmp"), b"3").expect("write tmp");
        fs.open(&p("state.tmp"), Mode::Write)
            .expect("open")
            .sync_all()
            .expect("sync");
        fs.rename(&p("state.tmp"), &p("state")).expect("rename");
        fs.sync_dir(Path::new(ROOT)).expect("sync dir");
        fs.power_loss();
        assert_eq!(fs.read(&p("state")).expect("read"), b"3");
        assert!(!fs.exists(&p("state.tmp")));
    }
    assert!(old_seen, "an unsynced rename was never lost");
}

#[test]
fn a_directory_that_did_not_survive_takes_its_files_along() {
    let fs = fs(0, never());
    fs.create_dir(&p("wal")).expect("mkdir");
    fs.write(&p("wal/1"), b"x").expect("write");
    fs.open(&p("wal/1"), Mode::Write)
        .expect("open")
        .sync_all()
        .expect("sync");
    fs.sync_dir(&p("wal")).expect("sync wal (not its parent)");
    // The root's queued "create wal" is the only name change left; seed 0 may keep it or not.
    let lost = fs.power_loss().names_lost;
    assert_eq!(fs.exists(&p("wal/1")), lost.is_empty());
}

#[test]
fn rot_flips_one_bit_of_one_synced_byte() {
    let fs = fs(5, never());
    fs.write(&p("f"), &[0xAA; 64]).expect("write");
    fs.open(&p("f"), Mode::Write)
        .expect("open")
        .sync_all()
        .expect("sync");
    fs.sync_dir(Path::new(ROOT)).expect("sync dir");
    let (file, at) = fs.rot(Path::new(ROOT)).expect("a byte to rot");
    assert_eq!(file, Path::new("f"));
    let bytes = fs.read(&p("f")).expect("read");
    let diff: u32 = bytes.iter().map(|b| (b ^ 0xAA).count_ones()).sum();
    assert_eq!(diff, 1);
    assert_ne!(bytes[at as usize], 0xAA);
    fs.power_loss();
    assert_eq!(
        fs.read(&p("f")).expect("read"),
        bytes,
        "the rot is on the disk"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let run = |seed| {
        let fs = fs(seed, DiskFaults::default());
        let f = fs.open(&p("log"), Mode::Create).expect("create");
        for i in 0..50u64 {
            f.write_all_at(&[i as u8 + 1; 1000], i * 1000)
                .expect("write");
            if i % 7 == 3 {
                f.sync_data().expect("sync");
            }
        }
        fs.sync_dir(Path::new(ROOT)).expect("sync dir");
        let loss = fs.power_loss();
        let bytes = fs.read(&p("log")).expect("read");
        (
            loss,
            bytes.iter().map(|b| *b as u64).sum::<u64>(),
            bytes.len(),
        )
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn the_power_goes_at_a_later_sync_between_writes_and_their_sync() {
    let fs = fs(4, never());
    let f = fs.open(&p("log"), Mode::Create).expect("create");
    f.write_all_at(b"one", 0).expect("write");
    fs.lose_power_at_sync(2);
    f.sync_data().expect("the first sync still works");
    fs.sync_dir(Path::new(ROOT))
        .map_err(|e| e.raw_os_error())
        .expect_err("the power goes");
    assert!(fs.is_dead());
    assert!(
        f.write_all_at(b"two", 3).is_err(),
        "a dead disk writes nothing"
    );
    assert!(fs.open(&p("log"), Mode::Read).is_err());
    // The sync of its directory died: the name is as unsure as any unsynced one; if it
    // survived, it holds what the first sync wrote.
    fs.power_loss();
    assert!(!fs.is_dead());
    if fs.exists(&p("log")) {
        assert_eq!(fs.read(&p("log")).expect("read"), b"one");
    }
}

#[test]
fn create_new_refuses_what_is_there_on_both_file_systems() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = SimFs::new(ROOT, 1);
    for (fs, root) in [
        (&OsFs as &dyn Fs, dir.path()),
        (&sim as &dyn Fs, Path::new(ROOT)),
    ] {
        let path = root.join("new");
        fs.open(&path, Mode::CreateNew).expect("created");
        assert_eq!(
            fs.open(&path, Mode::CreateNew)
                .map(|_| ())
                .map_err(|e| e.kind()),
            Err(io::ErrorKind::AlreadyExists)
        );
    }
}
