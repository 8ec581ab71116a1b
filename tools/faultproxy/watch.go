// Cutting a watch stream: the client's connection is taken over (hijacked) so the proxy
// writes the chunked framing itself and can stop anywhere, even inside a chunk.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// cutWatch relays the upstream's 200 watch stream to the client event by event and cuts
// it as x.fault says: cutAfterEvents=N closes the connection after N events (0 without
// midLine: right after the headers); with midLine the (N+1)th event is written only half,
// in a chunk whose size announces all of it, then the connection closes. BOOKMARK events
// pass through uncounted. A stream that ends before the cut ends normally.
func cutWatch(x *exchange, res *http.Response) error {
	defer x.cancel() // ends the upstream watch
	defer res.Body.Close()
	conn, brw, err := http.NewResponseController(x.w).Hijack()
	if err != nil {
		return err
	}
	defer conn.Close()
	// A client that hangs up ends the upstream watch too.
	go func() {
		_, _ = io.Copy(io.Discard, brw.Reader)
		x.cancel()
	}()

	h := res.Header.Clone()
	for _, k := range []string{"Connection", "Keep-Alive", "Content-Length", "Transfer-Encoding",
		"Trailer", "Upgrade", "Proxy-Connection", "Te"} {
		h.Del(k)
	}
	h.Set("Transfer-Encoding", "chunked")
	h.Set("Connection", "close") // this connection is not reused, cut or not
	var head bytes.Buffer
	fmt.Fprintf(&head, "HTTP/1.1 %d %s\r\n", res.StatusCode, http.StatusText(res.StatusCode))
	_ = h.Write(&head)
	head.WriteString("\r\n")
	if _, err := conn.Write(head.Bytes()); err != nil {
		return nil // the client is gone
	}
	cut, midLine := x.fault.CutAfterEvents, x.fault.MidLine
	if cut == 0 && !midLine {
		return nil
	}
	events := newEventReader(res.Body, res.Header.Get("Content-Type"))
	sent := 0
	for {
		ev, bookmark, rerr := events.Next()
		if len(ev) > 0 {
			if !bookmark && sent >= cut && midLine {
				_, _ = fmt.Fprintf(conn, "%x\r\n%s", len(ev), ev[:len(ev)/2])
				return nil
			}
			if _, err := fmt.Fprintf(conn, "%x\r\n%s\r\n", len(ev), ev); err != nil {
				return nil
			}
			if !bookmark {
				sent++
				if sent >= cut && !midLine {
					return nil
				}
			}
		}
		if rerr == io.EOF {
			_, _ = io.WriteString(conn, "0\r\n\r\n")
			return nil
		}
		if rerr != nil {
			return nil // the upstream broke off (or the client left): so does the client's stream
		}
	}
}

// eventReader splits a watch stream into events: JSON lines, or the 4-byte big-endian
// length-prefixed frames of a protobuf stream.
type eventReader struct {
	r        *bufio.Reader
	protobuf bool
}

func newEventReader(body io.Reader, contentType string) *eventReader {
	return &eventReader{r: bufio.NewReaderSize(body, 64<<10),
		protobuf: strings.Contains(contentType, "protobuf")}
}

// Next returns one event as it came (a line with its newline, a frame with its prefix)
// and whether it is a BOOKMARK; at the end a last partial event may come with the error.
func (e *eventReader) Next() ([]byte, bool, error) {
	if !e.protobuf {
		line, err := e.r.ReadBytes('\n')
		if len(line) == 0 {
			return nil, false, err
		}
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(line, &ev)
		return line, ev.Type == "BOOKMARK", err
	}
	var prefix [4]byte
	if n, err := io.ReadFull(e.r, prefix[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return prefix[:n], false, io.EOF
		}
		return nil, false, err
	}
	frame := make([]byte, 4+int(binary.BigEndian.Uint32(prefix[:])))
	copy(frame, prefix[:])
	n, err := io.ReadFull(e.r, frame[4:])
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	return frame[:4+n], protobufEventType(frame[4:4+n]) == "BOOKMARK", err
}

// protobufEventType reads field 1 (type) of a metav1.WatchEvent message.
func protobufEventType(msg []byte) string {
	if len(msg) < 2 || msg[0] != 0x0a {
		return ""
	}
	n, k := binary.Uvarint(msg[1:])
	if k <= 0 || uint64(len(msg)-1-k) < n {
		return ""
	}
	return string(msg[1+k : 1+k+int(n)])
}
