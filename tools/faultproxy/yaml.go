// A small YAML reader for kubeconfigs: block mappings and sequences, flow mappings and
// sequences ({a: b, c: [d]}, possibly over several lines), plain, single- and
// double-quoted scalars, comments and document markers. Scalars stay strings (plain
// null and ~ become nil). Anchors, aliases, tags and block scalars (| >) are refused.
package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

type yamlLine struct {
	indent int
	text   string // without indentation and comment
	no     int
}

type yamlParser struct {
	lines []yamlLine
	pos   int
}

func parseYAML(src string) (any, error) {
	p := &yamlParser{}
	for i, raw := range strings.Split(strings.ReplaceAll(src, "\r\n", "\n"), "\n") {
		if strings.ContainsRune(raw, '\t') && strings.TrimLeft(raw, " ") != strings.TrimLeft(raw, " \t") {
			return nil, fmt.Errorf("line %d: a tab in the indentation", i+1)
		}
		text := strings.TrimRight(stripComment(raw), " \t")
		trimmed := strings.TrimLeft(text, " ")
		if trimmed == "" || trimmed == "---" || trimmed == "..." || strings.HasPrefix(trimmed, "%") {
			continue
		}
		p.lines = append(p.lines, yamlLine{indent: len(text) - len(trimmed), text: trimmed, no: i + 1})
	}
	if len(p.lines) == 0 {
		return nil, nil
	}
	v, err := p.block(p.lines[0].indent)
	if err == nil && p.pos < len(p.lines) {
		err = fmt.Errorf("line %d: unexpected indentation", p.lines[p.pos].no)
	}
	return v, err
}

// eachUnquoted calls visit with the index of every byte of s outside quoted strings (a quote
// opens where opens(i) says; a backslash escapes inside double quotes) until visit returns
// false.
func eachUnquoted(s string, opens func(i int) bool, visit func(i int) bool) {
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '"' && c == '\\':
			i++
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case (c == '"' || c == '\'') && opens(i):
			quote = c
		default:
			if !visit(i) {
				return
			}
		}
	}
}

// stripComment drops a '#' comment that starts the line or follows a space, outside quotes.
func stripComment(s string) string {
	end := len(s)
	opens := func(i int) bool { return i == 0 || strings.ContainsRune(" \t:[{,-", rune(s[i-1])) }
	eachUnquoted(s, opens, func(i int) bool {
		if s[i] == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t') {
			end = i
			return false
		}
		return true
	})
	return s[:end]
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

func (p *yamlParser) block(indent int) (any, error) {
	if isSeqItem(p.lines[p.pos].text) {
		return p.sequence(indent)
	}
	return p.mapping(indent)
}

// mappingColon finds the ':' that ends a block key (followed by a space or the end).
func mappingColon(text string) int {
	if text == "" || text[0] == '{' || text[0] == '[' {
		return -1
	}
	colon := -1
	eachUnquoted(text, func(i int) bool { return i == 0 }, func(i int) bool {
		if text[i] == ':' && (i+1 == len(text) || text[i+1] == ' ') {
			colon = i
			return false
		}
		return true
	})
	return colon
}

func (p *yamlParser) mapping(indent int) (any, error) {
	m := map[string]any{}
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < indent {
			break
		}
		if l.indent > indent || isSeqItem(l.text) {
			return nil, fmt.Errorf("line %d: unexpected indentation", l.no)
		}
		colon := mappingColon(l.text)
		if colon < 0 {
			return nil, fmt.Errorf("line %d: %q is not key: value", l.no, l.text)
		}
		k, err := scalar(strings.TrimSpace(l.text[:colon]), l.no)
		if err != nil {
			return nil, err
		}
		key, _ := k.(string)
		rest := strings.TrimSpace(l.text[colon+1:])
		p.pos++
		var v any
		if rest == "" {
			if p.pos < len(p.lines) && (p.lines[p.pos].indent > indent ||
				(p.lines[p.pos].indent == indent && isSeqItem(p.lines[p.pos].text))) {
				if v, err = p.block(p.lines[p.pos].indent); err != nil {
					return nil, err
				}
			}
		} else if v, err = p.inline(rest, l.no, indent); err != nil {
			return nil, err
		}
		m[key] = v
	}
	return m, nil
}

func (p *yamlParser) sequence(indent int) (any, error) {
	s := []any{}
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < indent || (l.indent == indent && !isSeqItem(l.text)) {
			break
		}
		if l.indent > indent {
			return nil, fmt.Errorf("line %d: unexpected indentation", l.no)
		}
		rest := strings.TrimLeft(l.text[1:], " ")
		var v any
		var err error
		switch {
		case rest == "":
			p.pos++
			if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
				v, err = p.block(p.lines[p.pos].indent)
			}
		case isSeqItem(rest) || mappingColon(rest) >= 0:
			// "- key: value" opens a mapping (or "- - x" a sequence) at the item's column.
			p.lines[p.pos] = yamlLine{indent: l.indent + len(l.text) - len(rest), text: rest, no: l.no}
			v, err = p.block(p.lines[p.pos].indent)
		default:
			p.pos++
			v, err = p.inline(rest, l.no, indent)
		}
		if err != nil {
			return nil, err
		}
		s = append(s, v)
	}
	return s, nil
}

// inline reads a value after "key:" or "- ": a flow collection (joining the lines that
// continue it) or a scalar.
func (p *yamlParser) inline(text string, no, indent int) (any, error) {
	if text[0] == '{' || text[0] == '[' {
		for !flowClosed(text) && p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
			text += " " + p.lines[p.pos].text
			p.pos++
		}
		f := &flowParser{s: text, no: no}
		v, err := f.value("")
		if err == nil {
			f.space()
			if f.i < len(f.s) {
				err = fmt.Errorf("line %d: unexpected %q after a flow collection", no, f.s[f.i:])
			}
		}
		return v, err
	}
	if text[0] == '|' || text[0] == '>' || text[0] == '&' || text[0] == '*' || text[0] == '!' {
		return nil, fmt.Errorf("line %d: block scalars, anchors, aliases and tags are not supported", no)
	}
	return scalar(text, no)
}

func flowClosed(s string) bool {
	depth := 0
	eachUnquoted(s, func(int) bool { return true }, func(i int) bool {
		switch s[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		return true
	})
	return depth <= 0
}

// scalar: a quoted string, or a plain one (null and ~ are nil).
func scalar(s string, no int) (any, error) {
	if s == "" || s == "null" || s == "~" || s == "Null" || s == "NULL" {
		return nil, nil
	}
	switch s[0] {
	case '"':
		v, n, err := doubleQuoted(s)
		if err == nil && n != len(s) {
			err = fmt.Errorf("text after the closing quote")
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", no, err)
		}
		return v, nil
	case '\'':
		v, n, ok := singleQuoted(s)
		if !ok || n != len(s) {
			return nil, fmt.Errorf("line %d: a bad single-quoted string", no)
		}
		return v, nil
	}
	return s, nil
}

// doubleQuoted reads "..." at the start of s: the value and the bytes it took.
func doubleQuoted(s string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == '"' {
			return b.String(), i + 1, nil
		}
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '0':
			b.WriteByte(0)
		case '"', '\\', '/', ' ':
			b.WriteByte(e)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("a short \\%c escape", e)
			}
			r, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil {
				return "", 0, fmt.Errorf("a bad \\%c escape", e)
			}
			b.WriteString(string(rune(r)))
			i += n
		default:
			return "", 0, fmt.Errorf("an unknown escape \\%c", e)
		}
	}
	return "", 0, fmt.Errorf("an unterminated string")
}

func singleQuoted(s string) (string, int, bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] == '\'' {
			if i+1 < len(s) && s[i+1] == '\'' {
				b.WriteByte('\'')
				i++
				continue
			}
			return b.String(), i + 1, true
		}
		b.WriteByte(s[i])
	}
	return "", 0, false
}

// flowParser reads {...} and [...] on one (joined) line.
type flowParser struct {
	s  string
	i  int
	no int
}

func (f *flowParser) space() {
	for f.i < len(f.s) && (f.s[f.i] == ' ' || f.s[f.i] == '\t') {
		f.i++
	}
}

func (f *flowParser) errorf(format string, args ...any) error {
	return fmt.Errorf("line %d: %s", f.no, fmt.Sprintf(format, args...))
}

// value reads a value; `stops` are the characters that end a plain scalar here.
func (f *flowParser) value(stops string) (any, error) {
	f.space()
	if f.i >= len(f.s) {
		return nil, f.errorf("a flow collection ends early")
	}
	switch c := f.s[f.i]; c {
	case '{', '[':
		closer := map[byte]byte{'{': '}', '[': ']'}[c]
		f.i++
		m, seq := map[string]any{}, []any{}
		for {
			f.space()
			if f.i < len(f.s) && f.s[f.i] == closer {
				f.i++
				if c == '{' {
					return m, nil
				}
				return seq, nil
			}
			if c == '{' {
				k, err := f.value(":,}")
				if err != nil {
					return nil, err
				}
				key, _ := k.(string)
				f.space()
				var v any
				if f.i < len(f.s) && f.s[f.i] == ':' {
					f.i++
					if v, err = f.value(",}"); err != nil {
						return nil, err
					}
				}
				m[key] = v
			} else {
				v, err := f.value(",]")
				if err != nil {
					return nil, err
				}
				seq = append(seq, v)
			}
			f.space()
			if f.i < len(f.s) && f.s[f.i] == ',' {
				f.i++
			} else if f.i >= len(f.s) || f.s[f.i] != closer {
				return nil, f.errorf("expected ',' or %q in a flow collection", closer)
			}
		}
	case '"':
		v, n, err := doubleQuoted(f.s[f.i:])
		if err != nil {
			return nil, f.errorf("%v", err)
		}
		f.i += n
		return v, nil
	case '\'':
		v, n, ok := singleQuoted(f.s[f.i:])
		if !ok {
			return nil, f.errorf("a bad single-quoted string")
		}
		f.i += n
		return v, nil
	}
	start := f.i
	for f.i < len(f.s) {
		c := f.s[f.i]
		// ':' ends a plain key only when a space or the end of the entry follows.
		if c == ':' && strings.ContainsRune(stops, ':') &&
			(f.i+1 == len(f.s) || strings.ContainsRune(" ,}]", rune(f.s[f.i+1]))) {
			break
		}
		if c != ':' && strings.ContainsRune(stops, rune(c)) {
			break
		}
		_, size := utf8.DecodeRuneInString(f.s[f.i:])
		f.i += size
	}
	return scalar(strings.TrimSpace(f.s[start:f.i]), f.no)
}
