package engine

import "sync/atomic"

// What the server did with a sender's recent messages, for the recipients
// in this process: a delivery is owed (imcanary_deliveries_expected_total)
// only once the sender has the server's ack, so a delivery of a message
// the sender wrote off instead (no ack within the deadline, a reset that ate
// it, the session gone) is counted apart, as unowed, and never as
// delivered. Otherwise delivered could exceed expected after a network
// fault and the completeness SLIs would not be exact.
//
// The sender writes, under its user's lock; recipients' read loops and the
// sweeper read without a lock, so the record is atomics: two bits per
// message, for the last fateRing messages of the stream.

// fateRing is how many of a stream's latest messages the record covers. A
// delivery of an older one, or a message still unresolved when this many
// later ones have been written, is counted delivered as before (fateUnknown):
// that takes a stream sending fateRing messages within an ack timeout, far
// above a population user's rate. 512 is 128 bytes per send stream that
// has sent anything.
const fateRing = 512

// fate is the ack record of one send stream.
type fate struct {
	// sent is the highest seq written.
	sent atomic.Uint64
	// bits is made by the stream's first message, before sent is first
	// set: a stream that never sends (an idle population) holds none.
	bits atomic.Pointer[fateBits]
}

// fateBits has the bit of seq%fateRing set in acked once the server
// acknowledged seq, in off once the sender wrote it off; both clear while
// it is in flight. Never both: an ack after the write-off is ignored.
type fateBits struct {
	acked, off [fateRing / 64]atomic.Uint64
}

// fateOf is what became of one message.
type fateOf uint8

const (
	// fateUnknown: too far back for the record, or a seq this process
	// never wrote; counted delivered, as without the record.
	fateUnknown fateOf = iota
	fatePending        // written, neither acknowledged nor written off yet
	fateAcked          // acknowledged: owed to its recipients
	fateOff            // written off: never owed
)

func fateBit(seq uint64) (word int, bit uint64) {
	return int(seq % fateRing / 64), 1 << (seq % 64)
}

// write records seq as written and in flight. Called with the sender's
// lock held, before the message can reach anyone.
func (f *fate) write(seq uint64) {
	if f == nil {
		return
	}
	bits := f.bits.Load()
	if bits == nil {
		// Only the sender writes, under its lock.
		bits = new(fateBits)
		f.bits.Store(bits)
	}
	// sent first: a reader that sees the slot cleared also sees that it
	// now belongs to seq, so it never takes seq-fateRing for in flight.
	f.sent.Store(seq)
	w, b := fateBit(seq)
	bits.acked[w].And(^b)
	bits.off[w].And(^b)
}

// ack records seq as acknowledged; writeOff as written off. Both are called
// with the sender's lock held, once per seq, for a seq still in flight.
func (f *fate) ack(seq uint64) {
	if bits := f.record(); bits != nil {
		f.set(&bits.acked, seq)
	}
}

func (f *fate) writeOff(seq uint64) {
	if bits := f.record(); bits != nil {
		f.set(&bits.off, seq)
	}
}

// record returns f's bits, nil before its first message.
func (f *fate) record() *fateBits {
	if f == nil {
		return nil
	}
	return f.bits.Load()
}

func (f *fate) set(bits *[fateRing / 64]atomic.Uint64, seq uint64) {
	if f.sent.Load()-seq >= fateRing {
		// Its slot belongs to a later seq now.
		return
	}
	w, b := fateBit(seq)
	bits[w].Or(b)
}

// of returns what became of seq.
func (f *fate) of(seq uint64) fateOf {
	bits := f.record()
	if bits == nil {
		// Nothing written yet: as a seq this process never wrote.
		return fateUnknown
	}
	w, b := fateBit(seq)
	acked, off := bits.acked[w].Load()&b != 0, bits.off[w].Load()&b != 0
	// Read after the bits: see write.
	sent := f.sent.Load()
	switch {
	case seq > sent || sent-seq >= fateRing:
		return fateUnknown
	case acked:
		return fateAcked
	case off:
		return fateOff
	}
	return fatePending
}

// extend makes every seq up to top written and in flight, for a
// receiver's copy of another process's record (stream.takeMarks), which
// learns of a stream's seqs out of order and with gaps. A copy is
// touched by its inbox alone, under the inbox's lock.
func (f *fate) extend(top uint64) {
	bits := f.bits.Load()
	if bits == nil {
		bits = new(fateBits)
		f.bits.Store(bits)
	}
	sent := f.sent.Load()
	if top <= sent {
		return
	}
	from := sent + 1
	if top >= fateRing {
		from = max(from, top-fateRing+1)
	}
	f.sent.Store(top)
	for s := from; s <= top; s++ {
		w, b := fateBit(s)
		bits.acked[w].And(^b)
		bits.off[w].And(^b)
	}
}
