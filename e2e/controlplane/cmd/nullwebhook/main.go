// Command nullwebhook is the floor the injector's webhooks are measured against: a minimal HTTPS
// admission webhook, Go standard library only, that allows every request. On /mutate it answers
// with a fixed JSONPatch read at start (the bench gives it the very patch the injector returns for
// the benchmark's pod), on /validate with no patch. It does no work beyond reading the request's
// uid, so the time the API server spends on a call to it is the cost of the webhook mechanism
// itself: encoding the AdmissionReview, the HTTPS round trip, decoding the answer, applying the
// patch.
//
//	nullwebhook -listen 127.0.0.1:18444 -cert tls.crt -key tls.key -patch patch.json
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

type review struct {
	Request struct {
		UID string `json:"uid"`
	} `json:"request"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18444", "address to serve HTTPS on")
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
	http.HandleFunc("/mutate", answer(true))
	http.HandleFunc("/validate", answer(false))
	log.Fatal(http.ListenAndServeTLS(*listen, *cert, *key, nil))
}
