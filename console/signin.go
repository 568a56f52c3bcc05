package console

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Wrong sign-ins are limited per client host: a burst of signInBurst, then
// one every signInEvery. The token is at least 16 random bytes, so guessing
// was never the plan that works; the limit keeps a script from trying, and
// keeps the log line per wrong token from flooding. Behind a proxy every
// client is the proxy's host, and the limit is one for all of them.
const (
	signInBurst = 5
	signInEvery = 12 * time.Second
	// signInHosts bounds the hosts remembered; past it, hosts share one
	// limit until theirs are full again (forgotten).
	signInHosts = 4096
)

// signInLimiter counts wrong sign-ins per host.
type signInLimiter struct {
	mu    sync.Mutex
	hosts map[string]*rate.Limiter
	// shared is the limit of hosts beyond signInHosts.
	shared *rate.Limiter
}

func newSignInLimiter() *signInLimiter {
	return &signInLimiter{hosts: map[string]*rate.Limiter{}, shared: rate.NewLimiter(rate.Every(signInEvery), signInBurst)}
}

// limiter returns the limit of r's host.
func (l *signInLimiter) limiter(r *http.Request) *rate.Limiter {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lim, ok := l.hosts[host]; ok {
		return lim
	}
	if len(l.hosts) >= signInHosts {
		// Forget the hosts whose limit is full again: they are as if new.
		now := time.Now()
		for h, lim := range l.hosts {
			if lim.TokensAt(now) >= signInBurst {
				delete(l.hosts, h)
			}
		}
		if len(l.hosts) >= signInHosts {
			return l.shared
		}
	}
	lim := rate.NewLimiter(rate.Every(signInEvery), signInBurst)
	l.hosts[host] = lim
	return lim
}

// blocked says whether r's host has used up its wrong sign-ins, and for
// how long it must wait. A host that is not blocked may try.
func blocked(lim *rate.Limiter) (bool, time.Duration) {
	now := time.Now()
	if lim.TokensAt(now) >= 1 {
		return false, 0
	}
	res := lim.ReserveN(now, 1)
	wait := res.DelayFrom(now)
	res.CancelAt(now)
	return true, wait
}

// tooMany answers a blocked sign-in: 429 with Retry-After in whole seconds.
func (c *Console) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	secs := int(wait.Seconds() + 0.999)
	if secs < 1 {
		secs = 1
	}
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	c.fail(w, r, http.StatusTooManyRequests, "refused: too many wrong sign-ins from this address; try again in "+strconv.Itoa(secs)+" s")
}
