package mongofix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"go.mongodb.org/mongo-driver/x/bsonx/bsoncore"
	"go.mongodb.org/mongo-driver/x/mongo/driver/wiremessage"
)

// maxMessage is MongoDB's maxMessageSizeBytes, which FerretDB announces
// too: nothing larger is a message either side may send.
const maxMessage = 48_000_000

// readMessage reads one whole wire message: the 16-byte header and the
// body its length announces.
func readMessage(r io.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := int32(binary.LittleEndian.Uint32(head[:]))
	if n < 16 || n > maxMessage {
		return nil, fmt.Errorf("wire message length %d outside 16..%d", n, maxMessage)
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, fmt.Errorf("wire message of %d bytes: %w", n, err)
	}
	return msg, nil
}

// opMsg is an OP_MSG: its body (the kind 0 section) and its document
// sequences (kind 1), in which a driver sends the documents of an insert
// and the statements of an update or a delete.
type opMsg struct {
	requestID, responseTo int32
	flags                 wiremessage.MsgFlag
	body                  bsoncore.Document
	sequences             []docSeq
}

// docSeq is a kind 1 section: the command field it stands for and its
// documents.
type docSeq struct {
	ident string
	docs  []bsoncore.Document
}

// parseOpMsg splits msg, or says it is not an OP_MSG (ok false, no error:
// other op codes pass through untouched).
func parseOpMsg(msg []byte) (m opMsg, ok bool, err error) {
	_, reqID, respTo, op, rem, hok := wiremessage.ReadHeader(msg)
	if !hok {
		return m, false, errors.New("short wire message header")
	}
	if op != wiremessage.OpMsg {
		return m, false, nil
	}
	m.requestID, m.responseTo = reqID, respTo
	if m.flags, rem, hok = wiremessage.ReadMsgFlags(rem); !hok {
		return m, false, errors.New("OP_MSG without flag bits")
	}
	if m.flags&wiremessage.ChecksumPresent != 0 {
		if len(rem) < 4 {
			return m, false, errors.New("OP_MSG checksum flag set and no checksum")
		}
		rem = rem[:len(rem)-4]
	}
	for len(rem) > 0 {
		var kind wiremessage.SectionType
		if kind, rem, hok = wiremessage.ReadMsgSectionType(rem); !hok {
			return m, false, errors.New("OP_MSG section without a kind")
		}
		switch kind {
		case wiremessage.SingleDocument:
			if m.body != nil {
				return m, false, errors.New("OP_MSG with two body sections")
			}
			if m.body, rem, hok = wiremessage.ReadMsgSectionSingleDocument(rem); !hok {
				return m, false, errors.New("OP_MSG body section is not a BSON document")
			}
			if err := m.body.Validate(); err != nil {
				return m, false, fmt.Errorf("OP_MSG body: %w", err)
			}
		case wiremessage.DocumentSequence:
			var sq docSeq
			if sq.ident, sq.docs, rem, hok = wiremessage.ReadMsgSectionDocumentSequence(rem); !hok {
				return m, false, errors.New("OP_MSG document sequence section is malformed")
			}
			for _, d := range sq.docs {
				if err := d.Validate(); err != nil {
					return m, false, fmt.Errorf("OP_MSG document sequence %q: %w", sq.ident, err)
				}
			}
			m.sequences = append(m.sequences, sq)
		default:
			return m, false, fmt.Errorf("OP_MSG section of unknown kind %d", kind)
		}
	}
	if m.body == nil {
		return m, false, errors.New("OP_MSG without a body section")
	}
	return m, true, nil
}

// bytes assembles m with its (possibly new) body. The checksum, which
// covered the old bytes, is dropped with its flag: it is optional, and
// neither the driver nor FerretDB requires one.
func (m opMsg) bytes() []byte {
	idx, b := wiremessage.AppendHeaderStart(nil, m.requestID, m.responseTo, wiremessage.OpMsg)
	b = wiremessage.AppendMsgFlags(b, m.flags&^wiremessage.ChecksumPresent)
	b = wiremessage.AppendMsgSectionType(b, wiremessage.SingleDocument)
	b = append(b, m.body...)
	for _, sq := range m.sequences {
		b = wiremessage.AppendMsgSectionType(b, wiremessage.DocumentSequence)
		var at int32
		at, b = bsoncore.ReserveLength(b)
		b = append(append(b, sq.ident...), 0)
		for _, d := range sq.docs {
			b = append(b, d...)
		}
		b = bsoncore.UpdateLength(b, at, int32(len(b)-int(at)))
	}
	return bsoncore.UpdateLength(b, idx, int32(len(b)-int(idx)))
}
