package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// visible returns s with every character that would not show as itself
// written as an escape: control characters (ESC, NUL, C1; newlines and tabs
// too unless multiline), DEL, bidi controls and zero-width or other format
// characters, and bytes that are not UTF-8 (\xff). What a record holds can
// then be read, not acted on: no reordered text, no hidden characters. It
// does not escape HTML; html/template does, after it.
func visible(s string, multiline bool) string {
	clean := true
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, n, multiline) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !needsEscape(r, n, multiline):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}

func needsEscape(r rune, n int, multiline bool) bool {
	switch {
	case r == utf8.RuneError && n == 1:
		return true
	case r == '\n' || r == '\t':
		return !multiline
	case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
		return true
	case unicode.Is(unicode.Cf, r), unicode.Is(unicode.Zl, r), unicode.Is(unicode.Zp, r):
		return true // bidi controls, zero-width characters, BOM, line and paragraph separators
	case r == utf8.RuneError:
		return false // a real U+FFFD in the text
	}
	return false
}

// Payload views.
const (
	viewAuto = ""
	viewJSON = "json"
	viewText = "text"
	viewHex  = "hex"
)

// maxShown bounds the payload bytes a page shows; the download has all.
const maxShown = 256 << 10

// maxJSONDepth bounds the nesting of a payload shown indented as JSON:
// deeper JSON is shown as text.
const maxJSONDepth = 64

// maxIndented bounds the size of a payload shown indented as JSON:
// JSON that indented would be larger is shown as text.
const maxIndented = 512 << 10

// payloadView is a payload rendered for a page.
type payloadView struct {
	View    string // the view shown: json, text or hex
	Asked   string // the view asked for ("" for automatic)
	Body    string // the rendered text (visible: escapes for what cannot show)
	Size    int
	Cut     bool   // only the first maxShown bytes are shown
	Note    string // why the view asked for is not the one shown
	IsJSON  bool
	IsText  bool
	Nothing bool // an empty payload
}

// renderPayload renders b in the view asked for: JSON indented (when it is
// JSON), text (when it is UTF-8), hex; automatic picks the first that fits.
func renderPayload(b []byte, asked string) payloadView {
	pv := payloadView{Asked: asked, Size: len(b), Nothing: len(b) == 0}
	shown := b
	if len(shown) > maxShown {
		shown, pv.Cut = shown[:maxShown], true
	}
	pv.IsJSON = !pv.Cut && len(b) > 0 && json.Valid(b)
	tooBig := ""
	if pv.IsJSON {
		if depth, size := indentShape(b); depth > maxJSONDepth {
			tooBig = fmt.Sprintf("not shown as JSON: it is nested deeper than %d levels", maxJSONDepth)
		} else if size > maxIndented {
			tooBig = fmt.Sprintf("not shown as JSON: indented, it would be over %d KiB", maxIndented>>10)
		}
		pv.IsJSON = tooBig == ""
	}
	pv.IsText = utf8.Valid(shown) || (pv.Cut && utf8.Valid(trimPartialRune(shown)))
	view := asked
	switch asked {
	case viewJSON:
		if !pv.IsJSON {
			pv.Note = "not shown as JSON: it is not valid JSON"
			if pv.Cut {
				pv.Note = "not shown as JSON: too large to check here (download it)"
			}
			if tooBig != "" {
				pv.Note = tooBig
			}
			view = viewAuto
		}
	case viewText:
		if !pv.IsText {
			pv.Note = "shown as hex: it is not UTF-8 text"
			view = viewHex
		}
	case viewHex:
	default:
		view = viewAuto
	}
	if view == viewAuto {
		if asked == viewAuto && tooBig != "" {
			pv.Note = tooBig
		}
		switch {
		case pv.IsJSON:
			view = viewJSON
		case pv.IsText:
			view = viewText
		default:
			view = viewHex
		}
	}
	pv.View = view
	switch view {
	case viewJSON:
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			out.Reset()
			out.Write(b)
		}
		pv.Body = visible(out.String(), true)
	case viewText:
		pv.Body = visible(string(trimPartialRune(shown)), true)
	default:
		pv.Body = hexDump(shown)
	}
	return pv
}

// indentShape returns how deep valid JSON b nests and an upper bound of its
// size once indented by json.Indent with two spaces: b, plus a space per
// colon, plus a newline and the indent at every bracket, brace and comma
// (an empty array or object gets none; counting it anyway keeps the bound).
// It stops counting once either is over its limit.
func indentShape(b []byte) (maxDepth, size int) {
	depth, size := 0, len(b)
	inString, escaped := false, false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case ':':
			size++
		case '[', '{':
			depth++
			maxDepth = max(maxDepth, depth)
			size += 1 + 2*depth
		case ',':
			size += 1 + 2*depth
		case ']', '}':
			depth--
			size += 1 + 2*depth
		}
		if maxDepth > maxJSONDepth || size > maxIndented {
			return maxDepth, size
		}
	}
	return maxDepth, size
}

// trimPartialRune drops a rune cut at the end of b.
func trimPartialRune(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		if utf8.Valid(b[:len(b)-i]) {
			return b[:len(b)-i]
		}
	}
	return b
}

// hexDump writes b as hexdump -C does: offset, 16 bytes in hex, and the
// printable ASCII ones (others as '.').
func hexDump(b []byte) string {
	var out strings.Builder
	for off := 0; off < len(b); off += 16 {
		row := b[off:min(off+16, len(b))]
		fmt.Fprintf(&out, "%08x  ", off)
		for i := 0; i < 16; i++ {
			if i < len(row) {
				fmt.Fprintf(&out, "%02x ", row[i])
			} else {
				out.WriteString("   ")
			}
			if i == 7 {
				out.WriteByte(' ')
			}
		}
		out.WriteString(" |")
		for _, c := range row {
			if c >= 0x20 && c < 0x7f {
				out.WriteByte(c)
			} else {
				out.WriteByte('.')
			}
		}
		out.WriteString("|\n")
	}
	return out.String()
}
