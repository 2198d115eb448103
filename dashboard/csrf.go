package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
)

// csrfCookie holds the browser's random nonce; a form's token is the nonce's HMAC under
// the dashboard's secret. A cross-site page can neither read the cookie nor compute the
// HMAC, and SameSite=Strict keeps the browser from sending the cookie on its requests at
// all. A secret drawn per Dashboard means tokens die with the process: a page left open
// across a restart must be reloaded before its buttons work.
const (
	csrfCookie = "rowactor_dashboard_csrf"
	csrfField  = "csrf"
)

// csrfToken returns the token for r's nonce, setting a new nonce cookie (scoped to the
// mount prefix) when r has none.
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request, prefix string) string {
	nonce := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		nonce = c.Value
	} else {
		var b [16]byte
		_, _ = rand.Read(b[:]) // crypto/rand does not fail (Go 1.24+)
		nonce = hex.EncodeToString(b[:])
		path := prefix
		if path == "" {
			path = "/"
		}
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, Path: path, HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	}
	return d.sign(nonce)
}

func (d *Dashboard) sign(nonce string) string {
	m := hmac.New(sha256.New, d.secret)
	m.Write([]byte("rowactor dashboard csrf\x00" + nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// csrfOK checks a POST's token against its cookie's nonce.
func (d *Dashboard) csrfOK(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(d.sign(c.Value)))
}

// crossOriginCheck refuses a cross-origin POST by what the browser says of it
// (Sec-Fetch-Site, else Origin against Host): a second lock beside the token, for a
// browser that would send the cookie after all. Requests from other programs carry
// neither header and pass to the token check.
var crossOriginCheck = http.NewCrossOriginProtection()

// crossOrigin refuses a POST from another origin, and, under AllowHosts, one whose Origin
// names a host the dashboard does not serve.
func (d *Dashboard) crossOrigin(r *http.Request) error {
	if err := crossOriginCheck.Check(r); err != nil {
		return fmt.Errorf("a POST from another site is refused (%w)", err)
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" && d.cfg.hostCheck {
		u, err := url.Parse(o)
		if err != nil || !d.cfg.hostAllowed(u.Host) {
			return fmt.Errorf("a POST from origin %q is refused: not a host this dashboard serves", o)
		}
	}
	return nil
}
