use std::collections::VecDeque;

use super::*;

/// Small steps so that a few hundred bytes take several loops and slices.
const SMALL: Steps = Steps {
    step: 8,
    chunk_steps: 4,
    slice_steps: 2,
};

fn value(rank: usize, word: usize) -> u32 {
    ((word as u32).wrapping_mul(2_654_435_761)) ^ (rank as u32 + 1).wrapping_mul(40_503)
}

/// Runs every rank's schedule against the others' (the ring's connections as queues, each
/// transfer carrying the bytes its send read when it was posted) and returns each rank's buffer.
fn simulate(ranks: usize, words: usize, steps: Steps) -> Vec<Vec<u32>> {
    let bytes = words * ELEMENT;
    let schedules: Vec<Schedule> = (0..ranks)
        .map(|rank| ring_all_reduce(ranks, rank, 0, bytes, steps))
        .collect();
    let mut buffers: Vec<Vec<u32>> = (0..ranks)
        .map(|rank| (0..words).map(|word| value(rank, word)).collect())
        .collect();
    let mut sent = vec![0usize; ranks];
    let mut received = vec![0usize; ranks];
    // Queue `rank` holds what rank - 1 sent to it.
    let mut wires: Vec<VecDeque<Vec<u32>>> = vec![VecDeque::new(); ranks];
    loop {
        let mut moved = false;
        for rank in 0..ranks {
            let schedule = &schedules[rank];
            while let Some(send) = schedule.sends.get(sent[rank]) {
                if send.after.is_some_and(|after| after >= received[rank]) {
                    break;
                }
                let words =
                    &buffers[rank][send.offset / ELEMENT..(send.offset + send.length) / ELEMENT];
                wires[(rank + 1) % ranks].push_back(words.to_vec());
                sent[rank] += 1;
                moved = true;
            }
            while let Some(receive) = schedule.receives.get(received[rank]) {
                let Some(words) = wires[rank].pop_front() else {
                    break;
                };
                assert_eq!(
                    words.len() * ELEMENT,
                    receive.length,
                    "rank {rank} receive {}",
                    received[rank]
                );
                let at = receive.offset / ELEMENT;
                for (index, word) in words.into_iter().enumerate() {
                    let mine = &mut buffers[rank][at + index];
                    *mine = if receive.reduce {
                        mine.wrapping_add(word)
                    } else {
                        word
                    };
                }
                received[rank] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    for rank in 0..ranks {
        assert_eq!(
            sent[rank],
            schedules[rank].sends.len(),
            "rank {rank} sent all"
        );
        assert_eq!(
            received[rank],
            schedules[rank].receives.len(),
            "rank {rank} received all"
        );
        assert!(wires[rank].is_empty());
    }
    buffers
}

#[test]
fn every_rank_ends_with_the_sum_whatever_the_size() {
    for ranks in [2, 3, 4, 7] {
        for words in [1, 2, 5, 16, 33, 100, 1000] {
            let buffers = simulate(ranks, words, SMALL);
            for (rank, buffer) in buffers.iter().enumerate() {
                for (word, got) in buffer.iter().enumerate() {
                    let sum = (0..ranks).fold(0u32, |sum, r| sum.wrapping_add(value(r, word)));
                    assert_eq!(
                        *got, sum,
                        "{ranks} ranks, {words} words: rank {rank} word {word}"
                    );
                }
            }
        }
    }
}

#[test]
fn transfers_are_at_most_a_slice_and_match_the_neighbours() {
    let steps = Steps::NCCL;
    let bytes = 9 << 20;
    for rank in 0..4 {
        let mine = ring_all_reduce(4, rank, 0, bytes, steps);
        let next = ring_all_reduce(4, (rank + 1) % 4, 0, bytes, steps);
        assert_eq!(mine.sends.len(), next.receives.len());
        for (send, receive) in mine.sends.iter().zip(&next.receives) {
            assert_eq!(send.length, receive.length);
            assert!(send.length <= steps.slice());
        }
        // 2 (ranks - 1) steps, each moving a quarter of the data: 1.5 times the buffer out.
        let out: usize = mine.sends.iter().map(|s| s.length).sum();
        assert_eq!(out, 2 * 3 * bytes / 4);
    }
}

#[test]
fn one_rank_or_no_bytes_moves_nothing() {
    assert_eq!(
        ring_all_reduce(1, 0, 0, 1 << 20, Steps::NCCL),
        Schedule::default()
    );
    assert_eq!(
        ring_all_reduce(4, 2, 0, 0, Steps::NCCL),
        Schedule::default()
    );
}
