package mqtt

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// The packets themselves are encoded and decoded by the packets package of
// Eclipse Paho's Go client (MQTT 3.1.1). What is here is only what that
// package leaves to its caller: where one packet ends in a stream of
// WebSocket frames, which may hold several packets or part of one.

// maxRemaining is the largest remaining length MQTT's four-byte varint
// can say.
const maxRemaining = 268435455

// protocolLevel is MQTT 3.1.1's, in CONNECT.
const protocolLevel = 4

// split returns the size of the first packet of b and whether b holds all
// of it. A length field that runs past four bytes, or a packet larger than
// limit, is an error: the stream cannot be read on.
func split(b []byte, limit int) (size int, whole bool, err error) {
	n, mul := 0, 1
	for i := 1; i < 5; i++ {
		if i >= len(b) {
			return 0, false, nil
		}
		c := b[i]
		n += int(c&0x7f) * mul
		if c&0x80 == 0 {
			size = i + 1 + n
			if size > limit {
				return 0, false, fmt.Errorf("packet of %d bytes: larger than max_packet %d", size, limit)
			}
			return size, size <= len(b), nil
		}
		mul <<= 7
	}
	return 0, false, errors.New("malformed packet: remaining length longer than 4 bytes")
}

// decode reads the one whole packet p.
func decode(p []byte) (packets.ControlPacket, error) {
	cp, err := packets.ReadPacket(bytes.NewReader(p))
	if err != nil {
		return nil, fmt.Errorf("malformed %s packet: %w", packetName(p[0]>>4), err)
	}
	return cp, nil
}

func packetName(t byte) string {
	if n, ok := packets.PacketNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type %d", t)
}

// encode returns the wire form of cp.
func encode(cp packets.ControlPacket) []byte {
	var b bytes.Buffer
	// Write to a bytes.Buffer fails only if it cannot grow, which panics
	// first.
	_ = cp.Write(&b)
	return b.Bytes()
}

// Fixed two-byte packets.
var (
	pingreq    = []byte{packets.Pingreq << 4, 0}
	disconnect = []byte{packets.Disconnect << 4, 0}
)

func connectPacket(clientID, user string, password []byte, clean bool, keepalive uint16) []byte {
	c := packets.NewControlPacket(packets.Connect).(*packets.ConnectPacket)
	c.ProtocolName, c.ProtocolVersion = "MQTT", protocolLevel
	c.CleanSession, c.Keepalive, c.ClientIdentifier = clean, keepalive, clientID
	if user != "" {
		c.UsernameFlag, c.Username = true, user
	}
	if len(password) > 0 {
		c.PasswordFlag, c.Password = true, password
	}
	return encode(c)
}

func subscribePacket(id uint16, topics []string, qos byte) []byte {
	s := packets.NewControlPacket(packets.Subscribe).(*packets.SubscribePacket)
	s.MessageID, s.Topics = id, topics
	s.Qoss = bytes.Repeat([]byte{qos}, len(topics))
	return encode(s)
}

func publishPacket(topic string, id uint16, qos byte, payload []byte) []byte {
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.TopicName, p.MessageID, p.Qos, p.Payload = topic, id, qos, payload
	return encode(p)
}

// appendPuback appends the PUBACK of packet id.
func appendPuback(b []byte, id uint16) []byte {
	return append(b, packets.Puback<<4, 2, byte(id>>8), byte(id))
}

// connackReasons are CONNACK's refusals in MQTT 3.1.1 (§3.2.2.3).
var connackReasons = map[byte]string{
	1: "unacceptable protocol version",
	2: "identifier rejected",
	3: "server unavailable",
	4: "bad user name or password",
	5: "not authorized",
}
