package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"
)

// The picture's geometry, in pixels.
const (
	svgW, svgH    = 1200, 500
	plotX0        = 92   // left edge of the time axis
	plotX1        = 1168 // right edge
	lanesY        = 112  // top of the first lane
	laneH         = 88
	barY, barH    = 26, 20 // a term's bar, within its lane
	tickY         = 13     // centre of the write marks, within a lane
	renewY        = 53     // renewal dots, within a lane
	labelY        = 68     // baseline of the first row of labels, within a lane
	labelRowH     = 14
	fontFamily    = "Helvetica, Arial, 'Liberation Sans', sans-serif"
	colorText     = "#1f2937"
	colorMuted    = "#6b7280"
	colorGrid     = "#e5e7eb"
	colorTerm     = "#2563eb"
	colorOK       = "#16a34a"
	colorStale    = "#dc2626"
	colorNoLeader = "#ef4444"
	colorFrozen   = "#d97706"
)

// writeSVG draws the run in file: one lane per candidate with its terms as
// bars, its writes as ticks (accepted) and crosses (rejected), the faults,
// the leaderless gaps with their lengths, a time axis and a legend.
func writeSVG(file string, r *report) error {
	if err := os.WriteFile(file, renderSVG(r), 0o644); err != nil {
		return fmt.Errorf("writing the picture: %w", err)
	}
	return nil
}

// svgDoc accumulates SVG elements.
type svgDoc struct {
	bytes.Buffer
}

func (s *svgDoc) f(format string, args ...any) { fmt.Fprintf(s, format, args...) }

// text writes a text element; attrs are extra attributes.
func (s *svgDoc) text(x, y float64, size float64, anchor, attrs, txt string) {
	s.f(`<text x="%.1f" y="%.1f" font-size="%g" text-anchor="%s"%s>`, x, y, size, anchor, attrs)
	_ = xml.EscapeText(s, []byte(txt))
	s.WriteString("</text>\n")
}

// textWidth estimates the width of txt at size px in the picture's font
// (Helvetica's metrics, which Arial and Liberation Sans share).
func textWidth(txt string, size float64) float64 {
	em := 0
	for _, r := range txt {
		if r >= ' ' && r <= '~' {
			em += helveticaWidths[r-' ']
		} else {
			em += 600
		}
	}
	return float64(em) * size / 1000
}

// helveticaWidths are the advance widths of ASCII ' ' to '~' in 1/1000 em.
var helveticaWidths = [...]int{
	278, 278, 355, 556, 556, 889, 667, 191, 333, 333, 389, 584, 278, 333, 278, 278, // space to /
	556, 556, 556, 556, 556, 556, 556, 556, 556, 556, 278, 278, 584, 584, 584, 556, // 0 to ?
	1015, 667, 667, 722, 722, 667, 611, 778, 722, 278, 500, 667, 556, 833, 722, 778, // @ to O
	667, 778, 722, 667, 611, 722, 667, 944, 667, 667, 611, 278, 278, 278, 469, 556, // P to _
	333, 556, 556, 500, 556, 556, 278, 556, 556, 222, 222, 500, 222, 833, 556, 556, // ` to o
	556, 556, 333, 500, 278, 556, 500, 722, 500, 500, 500, 334, 260, 334, 584, // p to ~
}

// renderSVG returns the picture of the run.
func renderSVG(r *report) []byte {
	var s svgDoc
	total := niceCeil(r.end)
	x := func(t time.Duration) float64 {
		return plotX0 + (plotX1-plotX0)*float64(t)/float64(total)
	}
	laneTop := func(lane int) float64 { return lanesY + float64(lane)*laneH }
	lanesBottom := laneTop(len(r.names))
	checks := r.check()
	ok := len(failures(checks)) == 0
	accepted, rejected := r.counts()

	s.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" fill="%s">`+"\n",
		svgW, svgH, svgW, svgH, fontFamily, colorText)
	s.f(`<title>dsslock failover demo: three candidates, a handover, a crash and a frozen leader fenced off</title>` + "\n")
	s.f(`<defs><pattern id="frozen" width="7" height="7" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">` +
		`<rect width="7" height="7" fill="#fef3c7"/><line x1="0" y1="0" x2="0" y2="7" stroke="#f59e0b" stroke-width="2.5"/></pattern></defs>` + "\n")
	s.f(`<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", svgW, svgH)

	// Title, results, verdict.
	s.text(28, 38, 21, "start", ` font-weight="700"`, "Leader election with fenced writes: handover, crash, frozen leader")
	s.text(28, 62, 13.5, "start", ` fill="`+colorMuted+`"`, fmt.Sprintf(
		"3 candidates, TTL %v · the leader increments a counter every %v through a fenced writer · %d writes accepted, %d stale writes rejected · counter %d",
		r.ttl, writeEvery, accepted, rejected, r.counter))
	verdict, vcolor := fmt.Sprintf("✓ all %d checks passed", len(checks)), colorOK
	if !ok {
		verdict, vcolor = fmt.Sprintf("✗ %d of %d checks failed", len(failures(checks)), len(checks)), colorStale
	}
	s.text(svgW-28, 38, 14, "end", ` font-weight="700" fill="`+vcolor+`"`, verdict)

	// Lanes and the time grid.
	for i, name := range r.names {
		y := laneTop(i)
		fill := "#f8fafc"
		if i%2 == 1 {
			fill = "#ffffff"
		}
		s.f(`<rect class="lane" id="lane-%s" x="20" y="%.1f" width="%d" height="%d" fill="%s"/>`+"\n", name, y, svgW-40, laneH, fill)
		s.text(52, y+barY+barH/2+7, 22, "middle", ` font-weight="700"`, name)
		s.text(52, y+barY+barH/2+22, 10, "middle", ` fill="`+colorMuted+`"`, "candidate")
	}
	step := tickStep(total)
	for t := time.Duration(0); t <= total; t += step {
		s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x(t), float64(lanesY), x(t), lanesBottom, colorGrid)
	}

	// The leaderless gaps: bands across the lanes from the moment nobody
	// led; brackets above them, from the moment the measure starts, with
	// its length.
	gap := func(from, leaderless, to time.Duration, color, label string) {
		if to < from {
			return
		}
		x0, xl, x1 := x(from), x(max(leaderless, from)), x(to)
		s.f(`<rect x="%.1f" y="%d" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.09"/>`+"\n", xl, lanesY, max(x1-xl, 1), lanesBottom-lanesY, colorNoLeader)
		for _, xx := range []float64{x0, x1} {
			s.f(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="3 3" stroke-width="1"/>`+"\n", xx, lanesY-10, xx, lanesBottom, color)
		}
		s.f(`<path d="M%.1f %d H%.1f" stroke="%s" stroke-width="1.5"/>`+"\n", x0, lanesY-10, x1, color)
		w := textWidth(label, 12.5) * 1.08 // bold
		cx := clamp((x0+x1)/2, plotX0+w/2, plotX1-w/2)
		s.text(cx, lanesY-16, 12.5, "middle", ` font-weight="700" fill="`+color+`"`, label)
	}
	gap(r.handover.from, r.handover.from, r.handover.to, colorTerm, "handover "+fmtMS(r.handover.to-r.handover.from))
	gap(r.takeover.from, r.crash.at, r.takeover.to, colorNoLeader, fmt.Sprintf("takeover %s (TTL %s)", fmtMS(r.takeover.to-r.takeover.from), fmtMS(r.ttl)))
	gap(r.pause.lastRenewal, r.pause.lost, r.pause.next, colorFrozen, "frozen leader replaced: "+fmtMS(r.pause.next-r.pause.lastRenewal))

	// The frozen stretch of the paused leader: from the freeze to the heal.
	if r.pause.healed > 0 {
		y := laneTop(r.pause.lane) + barY
		s.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="url(#frozen)" rx="3"/>`+"\n", x(r.pause.frozen), y, x(r.pause.healed)-x(r.pause.frozen), barH)
	}

	// Terms: a bar from election to the end of leading; the frozen part
	// of the paused leader's term is pale.
	for _, t := range r.terms {
		y := laneTop(t.c.lane) + barY
		x0, x1 := x(t.elected), x(t.end)
		if t.how == "froze" {
			fx := x(r.pause.frozen)
			s.f(`<rect class="term" x="%.1f" y="%.1f" width="%.1f" height="%d" rx="3" fill="%s"/>`+"\n", x0, y, fx-x0, barH, colorTerm)
			s.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%d" rx="3" fill="%s" fill-opacity="0.35"/>`+"\n", fx-3, y, x1-fx+3, barH, colorTerm)
		} else {
			s.f(`<rect class="term" x="%.1f" y="%.1f" width="%.1f" height="%d" rx="3" fill="%s"/>`+"\n", x0, y, max(x1-x0, 2), barH, colorTerm)
		}
		if label := fmt.Sprintf("term %d", t.n); x1-x0 > textWidth(label, 11.5)+10 {
			s.text(x0+6, y+barH/2+4, 11.5, "start", ` fill="#ffffff" font-weight="700"`, label)
		}
		t.mu.Lock()
		for _, rn := range t.renewals {
			s.f(`<circle cx="%.1f" cy="%.1f" r="2.6" fill="%s"/>`+"\n", x(rn), laneTop(t.c.lane)+renewY, colorTerm)
		}
		t.mu.Unlock()
	}

	// Writes: a tick when the store applied it, a cross when refused as
	// stale. Marks closer than a mark's width are set side by side.
	lastX := map[int]float64{}
	for _, w := range r.writes {
		if !w.ok && !w.stale {
			continue
		}
		cx := x(w.at)
		if px, seen := lastX[w.lane]; seen && cx-px < 11 {
			cx = px + 11
		}
		lastX[w.lane] = cx
		cy := laneTop(w.lane) + tickY
		if w.ok {
			s.f(`<path class="write accepted" d="M%.1f %.1f l2.6 3 l5.2 -6.6" fill="none" stroke="%s" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"/>`+"\n", cx-3.9, cy+0.6, colorOK)
		} else {
			s.f(`<path class="write rejected" d="M%.1f %.1f l7 7 m0 -7 l-7 7" stroke="%s" stroke-width="2.2" stroke-linecap="round"/>`+"\n", cx-3.5, cy-3.5, colorStale)
		}
	}

	// Events, labelled under the bars.
	labels := map[int]*laneLabels{}
	label := func(lane int, at time.Duration, anchor, color, txt string) {
		if labels[lane] == nil {
			labels[lane] = &laneLabels{}
		}
		xx := x(at)
		switch anchor {
		case "end":
			xx -= 5
		case "start":
			xx += 5
		}
		labels[lane].add(&s, xx, laneTop(lane)+labelY, anchor, color, txt)
	}
	for _, t := range r.terms {
		switch t.how {
		case "resigned":
			label(t.c.lane, t.end, "end", colorMuted, "resigns")
		case "crashed":
			cx, cy := x(t.end), laneTop(t.c.lane)+barY+barH/2
			s.f(`<path d="M%.1f %.1f l-6.5 12 h5 l-2.5 10 l9 -14 h-5.5 l3 -8 z" fill="%s" stroke="#ffffff" stroke-width="1"/>`+"\n", cx+2, cy-11, colorStale)
			label(t.c.lane, t.end, "end", colorStale, "crashes: cut, no release")
		case "froze":
			p := r.pause
			label(t.c.lane, p.frozen, "middle", colorFrozen, "freezes")
			cx, cy := x(p.lost), laneTop(t.c.lane)+barY+barH/2
			s.f(`<path d="M%.1f %.1f l6 6 l-6 6 l-6 -6 z" fill="%s" stroke="#ffffff" stroke-width="1.2"/>`+"\n", cx, cy-6, colorFrozen)
			label(t.c.lane, p.lost, "middle", colorFrozen, "term ends on its own clock")
			label(t.c.lane, max(p.stales, p.next), "start", colorStale, "wakes: stale writes rejected")
		}
	}

	// The time axis.
	axisY := lanesBottom + 10
	s.f(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`+"\n", plotX0, axisY, plotX1, axisY, colorMuted)
	for t := time.Duration(0); t <= total; t += step {
		s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x(t), axisY, x(t), axisY+5, colorMuted)
		s.text(x(t), axisY+19, 11.5, "middle", ` fill="`+colorMuted+`"`, strconv.FormatFloat(t.Seconds(), 'f', -1, 64)+" s")
	}

	// The legend.
	legend(&s, axisY+50)
	s.text(svgW-28, svgH-14, 11, "end", ` fill="#9ca3af"`, "go run ./examples/failover -svg failover.svg")
	s.WriteString("</svg>\n")
	return s.Bytes()
}

// legend draws the legend, centred, with its baseline at y.
func legend(s *svgDoc, y float64) {
	type item struct {
		icon func(x float64) // draws a 16 px wide icon from x
		text string
	}
	items := []item{
		{func(x float64) {
			s.f(`<rect x="%.1f" y="%.1f" width="18" height="11" rx="2" fill="%s"/>`+"\n", x, y-10, colorTerm)
		}, "term: leading"},
		{func(x float64) {
			s.f(`<circle cx="%.1f" cy="%.1f" r="2.6" fill="%s"/>`+"\n", x+9, y-4.5, colorTerm)
		}, "renewal"},
		{func(x float64) {
			s.f(`<path d="M%.1f %.1f l2.6 3 l5.2 -6.6" fill="none" stroke="%s" stroke-width="2" stroke-linecap="round" stroke-linejoin="round"/>`+"\n", x+5, y-4, colorOK)
		}, "write accepted"},
		{func(x float64) {
			s.f(`<path d="M%.1f %.1f l7 7 m0 -7 l-7 7" stroke="%s" stroke-width="2.2" stroke-linecap="round"/>`+"\n", x+5.5, y-8, colorStale)
		}, "write rejected as stale"},
		{func(x float64) {
			s.f(`<path d="M%.1f %.1f l-4.5 8 h3.5 l-1.7 7 l6.2 -9.5 h-3.8 l2 -5.5 z" fill="%s"/>`+"\n", x+10, y-12, colorStale)
		}, "crash"},
		{func(x float64) {
			s.f(`<rect x="%.1f" y="%.1f" width="18" height="11" rx="2" fill="url(#frozen)"/>`+"\n", x, y-10)
		}, "frozen: connection blackholed"},
		{func(x float64) {
			s.f(`<path d="M%.1f %.1f l5 5 l-5 5 l-5 -5 z" fill="%s"/>`+"\n", x+9, y-10, colorFrozen)
		}, "term lost"},
		{func(x float64) {
			s.f(`<rect x="%.1f" y="%.1f" width="18" height="11" fill="%s" fill-opacity="0.15"/>`+"\n", x, y-10, colorNoLeader)
		}, "no leader"},
	}
	const size, iconW, gapW = 12.5, 24.0, 22.0
	width := 0.0
	for _, it := range items {
		width += iconW + textWidth(it.text, size) + gapW
	}
	x := (svgW - (width - gapW)) / 2
	for _, it := range items {
		it.icon(x)
		s.text(x+iconW, y, size, "start", "", it.text)
		x += iconW + textWidth(it.text, size) + gapW
	}
}

// laneLabels places labels under a lane's bars in rows, so that none
// overlaps another.
type laneLabels struct {
	rows [][][2]float64 // the extents taken in each row
}

func (l *laneLabels) add(s *svgDoc, x, y float64, anchor, color, txt string) {
	const size = 11.5
	w := textWidth(txt, size)
	left := x // the label's left edge
	switch anchor {
	case "middle":
		left -= w / 2
	case "end":
		left -= w
	}
	left = clamp(left, plotX0, plotX1-w)
	ext := [2]float64{left - 6, left + w + 6}
	row := 0
	for ; row < len(l.rows); row++ {
		free := true
		for _, e := range l.rows[row] {
			if ext[0] < e[1] && e[0] < ext[1] {
				free = false
				break
			}
		}
		if free {
			break
		}
	}
	if row == len(l.rows) {
		l.rows = append(l.rows, nil)
	}
	l.rows[row] = append(l.rows[row], ext)
	s.text(left, y+float64(row)*labelRowH, size, "start", ` fill="`+color+`"`, txt)
}

// niceCeil rounds d up to a multiple of a tick step, for the axis's end.
func niceCeil(d time.Duration) time.Duration {
	step := tickStep(d)
	return max((d+step-1)/step*step, step)
}

// tickStep is the axis's step: 1, 2 or 5 times a power of ten, for at most
// about ten ticks.
func tickStep(d time.Duration) time.Duration {
	for _, base := range []float64{1e-3, 1e-2, 1e-1, 1, 10, 100} {
		for _, m := range []float64{1, 2, 5} {
			step := time.Duration(base * m * float64(time.Second))
			if d/step <= 10 {
				return step
			}
		}
	}
	return 1000 * time.Second
}

// fmtMS formats d in milliseconds, to 0.1 ms below 10 ms.
func fmtMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if math.Abs(ms) < 10 {
		return strconv.FormatFloat(math.Round(ms*10)/10, 'f', -1, 64) + " ms"
	}
	return strconv.FormatFloat(math.Round(ms), 'f', -1, 64) + " ms"
}

func clamp(v, lo, hi float64) float64 {
	if hi < lo {
		return (lo + hi) / 2
	}
	return min(max(v, lo), hi)
}
