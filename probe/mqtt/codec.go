package mqtt

import (
	"bytes"
	"errors"
	"fmt"

	v5 "github.com/eclipse/paho.golang/packets"
	v3 "github.com/eclipse/paho.mqtt.golang/packets"
)

// The packets themselves are encoded and decoded by Eclipse Paho's Go
// packet libraries: the packets package of paho.mqtt.golang for MQTT
// 3.1.1, and that of paho.golang for MQTT 5. What is here is what they
// leave to their caller: where one packet ends in a stream of WebSocket
// frames, which may hold several packets or part of one (split), and one
// shape for what both decode (packet), so that the session is written once.

// maxRemaining is the largest remaining length MQTT's four-byte varint
// can say.
const maxRemaining = 268435455

// Packet types, the same numbers in both versions (fixed header, high
// nibble).
const (
	typeConnack  = 2
	typePublish  = 3
	typePuback   = 4
	typeSuback   = 9
	typePingresp = 13
	typeDisconn  = 14
)

// packet is one decoded packet of either version: what the session reads
// of the packets it handles.
type packet struct {
	typ byte
	// present is CONNACK's session present flag.
	present bool
	// code is CONNACK's return (3.1.1) or reason code (5), or PUBACK's
	// reason code (5; 0 in 3.1.1).
	code    byte
	id      uint16
	topic   string
	payload []byte
	qos     byte
	dup     bool
	// codes are SUBACK's, one per topic filter.
	codes []byte
}

// codec is one MQTT version's encoding.
type codec interface {
	connect(clientID, user string, password []byte, clean bool, keepalive uint16, expiry uint32) []byte
	// subscribe asks for topics at qos; noLocal[i] asks the broker not
	// to send the session its own publishes on topics[i] (MQTT 5 only).
	subscribe(id uint16, topics []string, qos byte, noLocal []bool) []byte
	publish(topic string, id uint16, qos byte, payload []byte) []byte
	// decode reads the one whole packet p.
	decode(p []byte) (packet, error)
	// refusal names a CONNACK code that refuses the connection, "" for
	// success.
	refusal(code byte) string
}

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

// packetName names packet type t as the specification does.
func packetName(t byte) string {
	if n, ok := v3.PacketNames[t]; ok {
		return n
	}
	if t == 15 {
		return "AUTH"
	}
	return fmt.Sprintf("packet type %d", t)
}

// Fixed two-byte packets, the same in both versions (an MQTT 5 DISCONNECT
// without a reason code is a normal disconnection).
var (
	pingreq    = []byte{12 << 4, 0}
	disconnect = []byte{typeDisconn << 4, 0}
)

// appendPuback appends the PUBACK of packet id: success, in either
// version.
func appendPuback(b []byte, id uint16) []byte {
	return append(b, typePuback<<4, 2, byte(id>>8), byte(id))
}

// codec311 is MQTT 3.1.1 (protocol level 4).
type codec311 struct{}

func encode3(cp v3.ControlPacket) []byte {
	var b bytes.Buffer
	// Writing to a bytes.Buffer fails only if it cannot grow, which
	// panics first.
	_ = cp.Write(&b)
	return b.Bytes()
}

func (codec311) connect(clientID, user string, password []byte, clean bool, keepalive uint16, _ uint32) []byte {
	c := v3.NewControlPacket(v3.Connect).(*v3.ConnectPacket)
	c.ProtocolName, c.ProtocolVersion = "MQTT", 4
	c.CleanSession, c.Keepalive, c.ClientIdentifier = clean, keepalive, clientID
	if user != "" {
		c.UsernameFlag, c.Username = true, user
	}
	if len(password) > 0 {
		c.PasswordFlag, c.Password = true, password
	}
	return encode3(c)
}

func (codec311) subscribe(id uint16, topics []string, qos byte, _ []bool) []byte {
	s := v3.NewControlPacket(v3.Subscribe).(*v3.SubscribePacket)
	s.MessageID, s.Topics = id, topics
	s.Qoss = bytes.Repeat([]byte{qos}, len(topics))
	return encode3(s)
}

func (codec311) publish(topic string, id uint16, qos byte, payload []byte) []byte {
	p := v3.NewControlPacket(v3.Publish).(*v3.PublishPacket)
	p.TopicName, p.MessageID, p.Qos, p.Payload = topic, id, qos, payload
	return encode3(p)
}

func (codec311) decode(b []byte) (packet, error) {
	cp, err := v3.ReadPacket(bytes.NewReader(b))
	if err != nil {
		return packet{}, fmt.Errorf("malformed %s: %w", packetName(b[0]>>4), err)
	}
	pk := packet{typ: b[0] >> 4}
	switch p := cp.(type) {
	case *v3.ConnackPacket:
		pk.present, pk.code = p.SessionPresent, p.ReturnCode
	case *v3.PublishPacket:
		pk.id, pk.topic, pk.payload, pk.qos, pk.dup = p.MessageID, p.TopicName, p.Payload, p.Qos, p.Dup
	case *v3.PubackPacket:
		pk.id = p.MessageID
	case *v3.SubackPacket:
		pk.id, pk.codes = p.MessageID, p.ReturnCodes
	}
	return pk, nil
}

// connackReasons311 are CONNACK's refusals in MQTT 3.1.1 (§3.2.2.3).
var connackReasons311 = map[byte]string{
	1: "unacceptable protocol version",
	2: "identifier rejected",
	3: "server unavailable",
	4: "bad user name or password",
	5: "not authorized",
}

func (codec311) refusal(code byte) string {
	if code == 0 {
		return ""
	}
	if r, ok := connackReasons311[code]; ok {
		return r
	}
	return "unknown return code"
}

// codec5 is MQTT 5.
type codec5 struct{}

func encode5(cp *v5.ControlPacket) []byte {
	var b bytes.Buffer
	_, _ = cp.WriteTo(&b)
	return b.Bytes()
}

func (codec5) connect(clientID, user string, password []byte, clean bool, keepalive uint16, expiry uint32) []byte {
	cp := v5.NewControlPacket(v5.CONNECT)
	c := cp.Content.(*v5.Connect)
	c.ClientID, c.CleanStart, c.KeepAlive = clientID, clean, keepalive
	if !clean {
		// Without it an MQTT 5 session ends with its connection.
		c.Properties.SessionExpiryInterval = &expiry
	}
	if user != "" {
		c.UsernameFlag, c.Username = true, user
	}
	if len(password) > 0 {
		c.PasswordFlag, c.Password = true, password
	}
	return encode5(cp)
}

func (codec5) subscribe(id uint16, topics []string, qos byte, noLocal []bool) []byte {
	cp := v5.NewControlPacket(v5.SUBSCRIBE)
	s := cp.Content.(*v5.Subscribe)
	s.PacketID = id
	for i, t := range topics {
		s.Subscriptions = append(s.Subscriptions, v5.SubOptions{Topic: t, QoS: qos, NoLocal: noLocal[i]})
	}
	return encode5(cp)
}

func (codec5) publish(topic string, id uint16, qos byte, payload []byte) []byte {
	cp := v5.NewControlPacket(v5.PUBLISH)
	p := cp.Content.(*v5.Publish)
	p.Topic, p.PacketID, p.QoS, p.Payload = topic, id, qos, payload
	return encode5(cp)
}

func (codec5) decode(b []byte) (packet, error) {
	cp, err := v5.ReadPacket(bytes.NewReader(b))
	if err != nil {
		return packet{}, fmt.Errorf("malformed %s: %w", packetName(b[0]>>4), err)
	}
	pk := packet{typ: b[0] >> 4}
	switch p := cp.Content.(type) {
	case *v5.Connack:
		pk.present, pk.code = p.SessionPresent, p.ReasonCode
	case *v5.Publish:
		pk.id, pk.topic, pk.payload, pk.qos, pk.dup = p.PacketID, p.Topic, p.Payload, p.QoS, p.Duplicate
	case *v5.Puback:
		pk.id, pk.code = p.PacketID, p.ReasonCode
	case *v5.Suback:
		pk.id, pk.codes = p.PacketID, p.Reasons
	case *v5.Disconnect:
		pk.code = p.ReasonCode
	}
	return pk, nil
}

// connackReasons5 are the CONNACK reason codes of MQTT 5 (§3.2.2.2) that
// refuse a connection.
var connackReasons5 = map[byte]string{
	0x80: "unspecified error", 0x81: "malformed packet", 0x82: "protocol error",
	0x83: "implementation specific error", 0x84: "unsupported protocol version",
	0x85: "client identifier not valid", 0x86: "bad user name or password",
	0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy",
	0x8a: "banned", 0x8c: "bad authentication method", 0x90: "topic name invalid",
	0x95: "packet too large", 0x97: "quota exceeded", 0x99: "payload format invalid",
	0x9a: "retain not supported", 0x9b: "QoS not supported", 0x9c: "use another server",
	0x9d: "server moved", 0x9f: "connection rate exceeded",
	// PUBACK's and DISCONNECT's own.
	0x91: "packet identifier in use", 0x8b: "server shutting down", 0x8d: "keep alive timeout",
	0x8e: "session taken over",
}

// reason5 names an MQTT 5 reason code.
func reason5(code byte) string {
	if r, ok := connackReasons5[code]; ok {
		return r
	}
	return fmt.Sprintf("reason code 0x%02x", code)
}

func (codec5) refusal(code byte) string {
	if code < 0x80 {
		return ""
	}
	return reason5(code)
}
