package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rowactor/rowactor"
)

// allocated is what serving r once allocates, in bytes (the process's TotalAlloc: the
// broker's own goroutines add little beside it).
func allocated(h http.Handler, r *http.Request) (uint64, *httptest.ResponseRecorder) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, rec
}

// A job list reads only what it shows: 8 rows of 1 MB payloads, 256 KB headers and
// 60 KB error texts cost a render a few hundred KB, not the 10.5 MB the rows hold.
func TestJobListDoesNotReadPayloads(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_big_")
		payload := `{"blob":"` + strings.Repeat("x", 1<<20) + `"}`
		hdr := map[string]string{"big": strings.Repeat("h", 256<<10)}
		errText := "boom: " + strings.Repeat("e", 60<<10)
		var ids []int64
		for range 8 { // 8 MB of payloads, twice the bound below
			ids = append(ids, f.publish(tb, "g", payload, rowactor.WithHeaders(hdr)))
		}
		f.exec("UPDATE "+f.q(tb.Name)+" SET error = ?", errText)
		d, err := New(f.b, []Table{{Table: tb}}, PageSize(20))
		if err != nil {
			t.Fatal(err)
		}
		page := "/jobs?table=" + url.QueryEscape(tb.Name)
		_, _ = allocated(d, httptest.NewRequest(http.MethodGet, page, nil)) // the first reads the catalog
		n, rec := allocated(d, httptest.NewRequest(http.MethodGet, page, nil))
		if got := listed(t, rec.Body.String()); rec.Code != http.StatusOK || !slices.Equal(got, ids) {
			t.Fatalf("job list: %d, rows %v, want %v", rec.Code, got, ids)
		}
		if !strings.Contains(rec.Body.String(), "boom: eee") {
			t.Error("the list does not show the rows' error")
		}
		t.Logf("a render of 8 big rows allocated %d KB", n>>10)
		if n > 4<<20 {
			t.Errorf("a list of 8 big rows allocated %d MB: it reads what it does not show", n>>20)
		}
	})
}

// The job page bounds every preview, whatever the payload: JSON nested 9,999 deep (whose
// indented form is 200 MB), a flat 2 MB JSON array and 1 MB of text each make a page of
// at most a few hundred KB that says the preview is cut; valid UTF-8 text shows as text,
// and only other bytes as hex.
func TestJobPageBoundsPreviews(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_prev_")
		deep := strings.Repeat("[", 9999) + strings.Repeat("]", 9999)
		flat := "[" + strings.Repeat("1234567,", (2<<20)/8) + "0]" // seven times the page's bound
		text := "héllo wörld: a text payload\nline two\t(tab)\n"
		bigText := strings.Repeat("ünïcode text ", (1<<20)/13)
		small := `{"to":"a@example.com"}`
		cases := []struct {
			name, payload string
			cut           bool
			want          string // on the page, HTML-escaped
			kind          string
		}{
			{"nested 9999 deep", deep, true, "[\n  [\n    [", "JSON"},
			{"flat 2 MB array", flat, true, "  1234567,\n  1234567,", "JSON"},
			{"text", text, false, "héllo wörld: a text payload\nline two\t(tab)", "text"},
			{"1 MB of text", bigText, true, "ünïcode text ünïcode text", "text"},
			{"small JSON", small, false, "{\n  &#34;to&#34;: &#34;a@example.com&#34;\n}", "JSON"},
			{"binary", "\x00\x01\x02" + strings.Repeat("\xff", 4000), true, "00 01 02 ff ff", "hex"},
		}
		d, err := New(f.b, []Table{{Table: tb}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			id := f.publish(tb, "g", c.payload)
			page := "/job?table=" + url.QueryEscape(tb.Name) + "&id=" + strconv.FormatInt(id, 10)
			rec := httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, page, nil))
			body := rec.Body.String()
			if rec.Code != http.StatusOK {
				t.Fatalf("%s: %d\n%.2000s", c.name, rec.Code, body)
			}
			if len(body) > 300<<10 {
				t.Errorf("%s: a page of %d KB", c.name, len(body)>>10)
			}
			if !strings.Contains(body, c.want) {
				t.Errorf("%s: the page lacks %q:\n%.3000s", c.name, c.want, body)
			}
			if !strings.Contains(body, fmt.Sprintf("%d bytes, %s", len(c.payload), c.kind)) {
				t.Errorf("%s: the page does not say %d bytes, %s:\n%.3000s", c.name, len(c.payload), c.kind, body)
			}
			if cut := strings.Contains(body, `data-cut="1"`); cut != c.cut {
				t.Errorf("%s: the page says cut %v, want %v", c.name, cut, c.cut)
			}
		}
	})
}

// Under its bounds the job page's JSON preview is json.Indent's text: strings holding
// brackets, commas, colons and escaped quotes, empty objects and arrays, whitespace.
func TestJSONPreviewIndentsAsJSONIndent(t *testing.T) {
	for _, src := range []string{
		`{"a":1,"b":[1,2,{"c":"x,y:[z]\"}{"}],"e":{},"f":[ ],"g":null}`,
		` [ true , false , "\\" , -1.5e3 , { "k" : [ [ ] ] } ] `,
		`"just a string"`, `42`, `{}`,
	} {
		var want bytes.Buffer
		if err := json.Indent(&want, []byte(src), "", "  "); err != nil {
			t.Fatal(err)
		}
		got, cut := indentJSON([]byte(src), previewBytes)
		if got != strings.TrimSpace(want.String()) || cut {
			t.Errorf("%s:\n%s\nwant\n%s", src, got, want.String())
		}
	}
}

// A job list links "← previous" and "next →" only where rows are: walking forwards and
// back by its links, no page is empty, the first page has no "previous" however it was
// reached, and the last none "next", even when it is exactly full.
func TestJobListLinksOnlyToPagesWithRows(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_pages_")
		var ids []int64
		for range 6 {
			ids = append(ids, f.publish(tb, "g", "{}"))
		}
		f.publish(tb, "other", "{}")
		d, err := New(f.b, []Table{{Table: tb}}, PageSize(3))
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "/ops")
		host := strings.TrimSuffix(u, "/ops")
		load := func(page string) (rows []int64, prev, next string) {
			t.Helper()
			status, body := get(t, c, page)
			if status != http.StatusOK {
				t.Fatalf("%s: %d\n%s", page, status, body)
			}
			return listed(t, body), link(body, "prev"), link(body, "next")
		}
		first, prev, next := load(u + "/jobs?table=" + url.QueryEscape(tb.Name) + "&group=g")
		if !slices.Equal(first, ids[:3]) || prev != "" || next == "" {
			t.Fatalf("first page %v, prev %q, next %q", first, prev, next)
		}
		second, prev, next := load(host + next)
		if !slices.Equal(second, ids[3:]) || prev == "" {
			t.Fatalf("second page %v, prev %q", second, prev)
		}
		if next != "" {
			rows, _, _ := load(host + next)
			t.Errorf("the last page (exactly full) links next to %s, which lists %v", next, rows)
		}
		back, prev, next := load(host + prev)
		if !slices.Equal(back, ids[:3]) || next == "" {
			t.Fatalf("back to the first page: %v, next %q", back, next)
		}
		if prev != "" {
			rows, _, _ := load(host + prev)
			t.Errorf("the first page, reached backwards, links previous to %s, which lists %v", prev, rows)
		}
	})
}

// Filter input the list cannot use is refused with a message naming the field (400),
// not passed to the database: an attempt past the column's range once showed the
// driver's encoding error.
func TestJobListRefusesBadFilterInput(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		tb := f.jobsTable("dash_badfilter_")
		f.publish(tb, "g", "{}")
		d, err := New(f.b, []Table{{Table: tb}})
		if err != nil {
			t.Fatal(err)
		}
		c, u := serve(t, d, "")
		list := u + "/jobs?table=" + url.QueryEscape(tb.Name)
		for q, field := range map[string]string{
			"&min_attempt=9223372036854775807": "min_attempt", "&min_attempt=99999999999999999999": "min_attempt",
			"&min_attempt=-2": "min_attempt", "&min_attempt=two": "min_attempt",
			"&state=finished": "state", "&after=x": "after", "&before=-5": "before",
		} {
			status, body := get(t, c, list+q)
			msg := body
			if i := strings.Index(body, `id="page-error"`); i >= 0 {
				msg = body[i:]
				msg = msg[:strings.Index(msg, "</p>")]
			}
			if status != http.StatusBadRequest || !strings.Contains(msg, field) || strings.Contains(strings.ToLower(msg), "encod") {
				t.Errorf("%s: %d, %q; want 400 naming %s", q, status, msg, field)
			}
		}
		if status, body := get(t, c, list+"&min_attempt=2147483647&state=due"); status != http.StatusOK || len(listed(t, body)) != 0 {
			t.Errorf("the largest attempt: %d, %v", status, listed(t, body))
		}
	})
}
