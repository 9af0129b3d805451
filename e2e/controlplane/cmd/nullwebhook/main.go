// Command nullwebhook is the floor the injector's webhooks are measured against: a minimal HTTPS
// admission webhook, Go standard library only, that allows every request. On /mutate it answers
// with a fixed JSONPatch read at start (the bench gives it the very patch the injector returns for
// the benchmark's pod), on /validate with no patch. It does no work beyond reading the request's
// uid, so the time the API server spends on a call to it is the cost of the webhook mechanism
// itself: encoding the AdmissionReview, the HTTPS round trip, decoding the answer, applying the
// patch.
//
// -listen serves HTTP/1.1 only: what the API server speaks to every webhook it reaches through a
// Service, and to URL webhooks off loopback (k8s.io/apiserver/pkg/util/webhook sets NextProtos to
// http/1.1 there, kubernetes/kubernetes#75791). -listen-h2, when given, also offers HTTP/2, which the
// API server uses only for a URL webhook on loopback: the bench measures what the protocol changes.
//
//	nullwebhook -listen 127.0.0.1:18444 [-listen-h2 127.0.0.1:18445] -cert tls.crt -key tls.key -patch patch.json
package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"os"
)

// serve serves mux over TLS on addr, with HTTP/2 offered or not.
func serve(addr string, http2 bool, cert, key string, mux http.Handler) error {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(http2)
	server := &http.Server{Addr: addr, Handler: mux, Protocols: protocols}
	return server.ListenAndServeTLS(cert, key)
}

type review struct {
	Request struct {
		UID string `json:"uid"`
	} `json:"request"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18444", "address to serve HTTPS on, HTTP/1.1 only")
	listenH2 := flag.String("listen-h2", "", "address to serve HTTPS on with HTTP/2 offered too (off when empty)")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "serving key (PEM)")
	patchFile := flag.String("patch", "", "JSONPatch answered on /mutate")
	flag.Parse()
	patch, err := os.ReadFile(*patchFile)
	if err != nil {
		log.Fatalf("reading the patch: %v", err)
	}
	encoded := base64.StdEncoding.EncodeToString(patch)
	answer := func(withPatch bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var in review
			if err := json.Unmarshal(body, &in); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			response := map[string]any{"uid": in.Request.UID, "allowed": true}
			if withPatch {
				response["patchType"] = "JSONPatch"
				response["patch"] = encoded
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response,
			})
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", answer(true))
	mux.HandleFunc("/validate", answer(false))
	if *listenH2 != "" {
		go func() { log.Fatal(serve(*listenH2, true, *cert, *key, mux)) }()
	}
	log.Fatal(serve(*listen, false, *cert, *key, mux))
}
