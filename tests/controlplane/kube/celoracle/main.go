// Command celoracle evaluates CEL expressions in the environment kube-apiserver gives
// ValidatingAdmissionPolicy and MutatingAdmissionPolicy expressions, so gpuguard's own CEL
// environment (policies/cel.py) can be compared with the reference implementation.
//
// Test tier only; nothing here ships. The environment is built exactly as the admission plugins
// build theirs (k8s.io/apiserver/pkg/admission/plugin/policy/validating/plugin.go and
// .../mutating/compilation.go):
//
//	plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
//
// with strict cost (environment.StrictCostOpt, added by the compiler), the variables object,
// oldObject, params, request (kubernetes.AdmissionRequest), namespaceObject (kubernetes.Namespace),
// variables (composited, lazily evaluated), authorizer and authorizer.requestResource. An
// expression is compiled in the NewExpressions environment, as the API server validates a policy
// being created (pkg/apis/admissionregistration/validation), and run from the StoredExpressions
// environment, as admission runs a stored policy.
//
// Protocol: one JSON object per line on stdin, one JSON object per line on stdout, in order.
//
//	in:  {"id": any, "expression": "...", "vars": {"object": ..., "oldObject": ..., "request": ...,
//	      "params": ..., "namespaceObject": ...}, "variables": [{"name": "...", "expression": "..."}],
//	      "mutation": false, "hasParams": true, "authorizer": {"decision": "allow|deny|noOpinion",
//	      "reason": "...", "rules": [{"verb": "...", "group": "...", "resource": "...", ...,
//	      "decision": "..."}]}}
//	out: {"id": any, "value": <tagged>, "type": "int", "cost": 3}
//	     {"id": any, "error": "no such key: x", "cost": 1}
//	     {"id": any, "compileError": "ERROR: <input>:1:3: ...", "storedOnly": false}
//	     {"id": any, "inputError": "..."}     (the line itself is not usable)
//
// Values are tagged so that JSON keeps CEL's types: null, bool, string and list as themselves;
// int as a JSON integer; {"uint": n}, {"double": "1.5"} (Go's shortest form; "NaN", "+Inf",
// "-Inf"), {"bytes": base64}, {"timestamp": RFC 3339, UTC}, {"duration": nanoseconds},
// {"type": name}, {"optional": v} or {"optionalNone": true}, {"map": [[k, v], ...]} and, for the
// Kubernetes opaque types (Quantity, IP, CIDR, URL, Semver, Format, ...), {"opaque": type name,
// "string": string(v) where defined}.
//
// `celoracle -info` prints the Kubernetes version and the compatibility version used.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	celgo "github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"

	"k8s.io/apimachinery/pkg/runtime/schema"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/apiserver/pkg/cel/library"
	"k8s.io/component-base/version"
)

// evalTimeout bounds one evaluation; CEL interrupts comprehensions when the context ends.
const evalTimeout = 20 * time.Second

type variableSpec struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}

type authzRule struct {
	Verb        string `json:"verb"`
	Group       string `json:"group"`
	Resource    string `json:"resource"`
	Subresource string `json:"subresource"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Path        string `json:"path"`
	Decision    string `json:"decision"`
	Reason      string `json:"reason"`
}

type authzSpec struct {
	Decision string      `json:"decision"`
	Reason   string      `json:"reason"`
	Rules    []authzRule `json:"rules"`
}

type input struct {
	ID         any            `json:"id"`
	Expression *string        `json:"expression"`
	Vars       map[string]any `json:"vars"`
	Variables  []variableSpec `json:"variables"`
	Mutation   bool           `json:"mutation"`
	HasParams  *bool          `json:"hasParams"`
	Authorizer *authzSpec     `json:"authorizer"`
}

type output struct {
	ID           any     `json:"id"`
	Value        any     `json:"value,omitempty"`
	HasValue     bool    `json:"-"`
	Type         string  `json:"type,omitempty"`
	Cost         *uint64 `json:"cost,omitempty"`
	Error        string  `json:"error,omitempty"`
	CompileError string  `json:"compileError,omitempty"`
	StoredOnly   bool    `json:"storedOnly,omitempty"`
	InputError   string  `json:"inputError,omitempty"`
}

// MarshalJSON writes "value": null for a null result (omitempty would drop it).
func (o output) MarshalJSON() ([]byte, error) {
	type plain output
	raw, err := json.Marshal(plain(o))
	if err != nil || !o.HasValue || o.Value != nil {
		return raw, err
	}
	return append(raw[:len(raw)-1], []byte(`,"value":null}`)...), nil
}

type accessor struct {
	expression string
	name       string
}

func (a accessor) GetExpression() string      { return a.expression }
func (a accessor) ReturnTypes() []*celgo.Type { return []*celgo.Type{celgo.AnyType} }
func (a accessor) GetName() string            { return a.name }

var baseEnv = environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())

// plainCompiler has no composited variables; it is reused by every input without variables
// (CompileCELExpression does not change the compiler's state, CompileAndStoreVariable does).
var plainCompiler = mustCompiler()

func mustCompiler() *plugincel.CompositedCompiler {
	c, err := plugincel.NewCompositedCompiler(baseEnv)
	if err != nil {
		panic(err)
	}
	return c
}

func main() {
	info := flag.Bool("info", false, "print the Kubernetes and CEL compatibility versions and exit")
	flag.Parse()
	if *info {
		_ = json.NewEncoder(os.Stdout).Encode(map[string]string{
			"kubernetes":           version.DefaultKubeBinaryVersion,
			"compatibilityVersion": environment.DefaultCompatibilityVersion().String(),
		})
		return
	}
	reader := bufio.NewReaderSize(os.Stdin, 1<<20)
	writer := bufio.NewWriter(os.Stdout)
	encoder := json.NewEncoder(writer)
	encoder.SetEscapeHTML(false)
	for {
		line, err := reader.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if encErr := encoder.Encode(handle(line)); encErr != nil {
				fmt.Fprintln(os.Stderr, "celoracle: cannot encode a result:", encErr)
				os.Exit(1)
			}
			if err := writer.Flush(); err != nil {
				os.Exit(1)
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "celoracle: reading stdin:", err)
			os.Exit(1)
		}
	}
}

func handle(line []byte) (out output) {
	var in input
	decoder := json.NewDecoder(bytes.NewReader(line))
	decoder.UseNumber()
	if err := decoder.Decode(&in); err != nil {
		return output{InputError: "not a JSON object: " + err.Error()}
	}
	out.ID = in.ID
	defer func() {
		if r := recover(); r != nil {
			out = output{ID: in.ID, Error: fmt.Sprintf("celoracle: panic: %v", r)}
		}
	}()
	if in.Expression == nil {
		out.InputError = "missing \"expression\""
		return out
	}
	vars := map[string]any{}
	for name, value := range in.Vars {
		switch name {
		case "object", "oldObject", "params", "request", "namespaceObject":
			vars[name] = unstructured(value)
		default:
			out.InputError = fmt.Sprintf("vars: %q is not a VAP variable (object, oldObject, params, request, namespaceObject)", name)
			return out
		}
	}
	options := plugincel.OptionalVariableDeclarations{
		HasParams:     in.HasParams == nil || *in.HasParams,
		HasAuthorizer: true,
		HasPatchTypes: in.Mutation,
	}
	compiler := plainCompiler
	if len(in.Variables) > 0 {
		compiler = mustCompiler()
		for _, v := range in.Variables {
			// Same env type as the expression: compile errors of a variable surface when used.
			compiler.CompileAndStoreVariable(accessor{v.Expression, v.Name}, options, environment.StoredExpressions)
		}
	}
	newResult := compiler.CompileCELExpression(accessor{expression: *in.Expression}, options, environment.NewExpressions)
	stored := compiler.CompileCELExpression(accessor{expression: *in.Expression}, options, environment.StoredExpressions)
	if stored.Error != nil {
		out.CompileError = stored.Error.Detail
		return out
	}
	if newResult.Error != nil {
		out.CompileError = newResult.Error.Detail
		out.StoredOnly = true
		return out
	}
	ctx, cancel := context.WithTimeout(context.Background(), evalTimeout)
	defer cancel()
	composition := compiler.CreateContext(ctx)
	act := &activation{vars: vars}
	act.variables = composition.Variables(act)
	userInfo := userFrom(vars["request"])
	authz := newAuthorizer(in.Authorizer)
	act.authorizer = library.NewAuthorizerVal(userInfo, authz)
	act.requestResource = library.NewResourceAuthorizerVal(userInfo, authz, resourceFrom(vars["request"]))
	value, details, err := stored.Program.ContextEval(composition, act)
	if details != nil && details.ActualCost() != nil {
		cost := *details.ActualCost() + uint64(composition.GetAndResetCost())
		out.Cost = &cost
	}
	if err != nil {
		out.Error = err.Error()
		return out
	}
	tagged, err := tag(value)
	if err != nil {
		out.Error = "celoracle: " + err.Error()
		return out
	}
	out.Value, out.HasValue = tagged, true
	out.Type = value.Type().TypeName()
	return out
}

// unstructured turns decoded JSON into what k8s.io/apimachinery's unstructured JSON decoding
// gives: integers as int64, other numbers as float64 (an integer beyond int64 as float64).
func unstructured(value any) any {
	switch v := value.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return i
		}
		f, _ := strconv.ParseFloat(string(v), 64)
		return f
	case map[string]any:
		for k, item := range v {
			v[k] = unstructured(item)
		}
		return v
	case []any:
		for i, item := range v {
			v[i] = unstructured(item)
		}
		return v
	default:
		return v
	}
}

type activation struct {
	vars                                   map[string]any
	variables, authorizer, requestResource any
}

// ResolveName follows plugincel's evaluationActivation: every VAP variable resolves, absent
// data as null.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case plugincel.ObjectVarName, plugincel.OldObjectVarName, plugincel.ParamsVarName,
		plugincel.RequestVarName, plugincel.NamespaceVarName:
		value, ok := a.vars[name]
		if !ok || value == nil {
			return types.NullValue, true
		}
		return types.DefaultTypeAdapter.NativeToValue(value), true
	case plugincel.VariableVarName:
		return a.variables, true
	case plugincel.AuthorizerVarName:
		return a.authorizer, true
	case plugincel.RequestResourceAuthorizerVarName:
		return a.requestResource, true
	}
	return nil, false
}

func (a *activation) Parent() interpreter.Activation { return nil }

func field(m any, path ...string) any {
	for _, key := range path {
		asMap, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = asMap[key]
	}
	return m
}

func text(m any, path ...string) string {
	s, _ := field(m, path...).(string)
	return s
}

func userFrom(request any) user.Info {
	info := &user.DefaultInfo{
		Name: text(request, "userInfo", "username"),
		UID:  text(request, "userInfo", "uid"),
	}
	if groups, ok := field(request, "userInfo", "groups").([]any); ok {
		for _, g := range groups {
			if s, ok := g.(string); ok {
				info.Groups = append(info.Groups, s)
			}
		}
	}
	if extra, ok := field(request, "userInfo", "extra").(map[string]any); ok {
		info.Extra = map[string][]string{}
		for k, values := range extra {
			list, _ := values.([]any)
			for _, v := range list {
				if s, ok := v.(string); ok {
					info.Extra[k] = append(info.Extra[k], s)
				}
			}
		}
	}
	return info
}

type requestResource struct{ request any }

func (r requestResource) GetName() string      { return text(r.request, "name") }
func (r requestResource) GetNamespace() string { return text(r.request, "namespace") }
func (r requestResource) GetSubresource() string {
	return text(r.request, "subResource")
}
func (r requestResource) GetResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{
		Group:    text(r.request, "resource", "group"),
		Version:  text(r.request, "resource", "version"),
		Resource: text(r.request, "resource", "resource"),
	}
}

func resourceFrom(request any) library.Resource { return requestResource{request} }

// staticAuthorizer answers from the input's rules (first match) or its default decision; with
// no "authorizer" in the input every check has no opinion (as RBAC without a matching rule).
type staticAuthorizer struct{ spec authzSpec }

func newAuthorizer(spec *authzSpec) authorizer.UnconditionalAuthorizer {
	if spec == nil {
		return staticAuthorizer{}
	}
	return staticAuthorizer{*spec}
}

func decision(name string) authorizer.Decision {
	switch strings.ToLower(name) {
	case "allow":
		return authorizer.DecisionAllow
	case "deny":
		return authorizer.DecisionDeny
	default:
		return authorizer.DecisionNoOpinion
	}
}

func matches(want, got string) bool { return want == "" || want == "*" || want == got }

func (s staticAuthorizer) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	for _, r := range s.spec.Rules {
		if matches(r.Verb, a.GetVerb()) && matches(r.Group, a.GetAPIGroup()) &&
			matches(r.Resource, a.GetResource()) && matches(r.Subresource, a.GetSubresource()) &&
			matches(r.Namespace, a.GetNamespace()) && matches(r.Name, a.GetName()) &&
			matches(r.Path, a.GetPath()) {
			return decision(r.Decision), r.Reason, nil
		}
	}
	return decision(s.spec.Decision), s.spec.Reason, nil
}

func tag(value ref.Val) (any, error) {
	switch v := value.(type) {
	case types.Null:
		return nil, nil
	case types.Bool:
		return bool(v), nil
	case types.Int:
		return json.Number(strconv.FormatInt(int64(v), 10)), nil
	case types.Uint:
		return map[string]any{"uint": json.Number(strconv.FormatUint(uint64(v), 10))}, nil
	case types.Double:
		return map[string]any{"double": strconv.FormatFloat(float64(v), 'g', -1, 64)}, nil
	case types.String:
		return string(v), nil
	case types.Bytes:
		return map[string]any{"bytes": base64.StdEncoding.EncodeToString(v)}, nil
	case types.Timestamp:
		return map[string]any{"timestamp": v.Time.UTC().Format(time.RFC3339Nano)}, nil
	case types.Duration:
		return map[string]any{"duration": json.Number(strconv.FormatInt(v.Duration.Nanoseconds(), 10))}, nil
	case *types.Optional:
		if !v.HasValue() {
			return map[string]any{"optionalNone": true}, nil
		}
		inner, err := tag(v.GetValue())
		return map[string]any{"optional": inner}, err
	case *types.Type:
		return map[string]any{"type": v.TypeName()}, nil
	case *types.Err:
		return nil, v
	}
	if lister, ok := value.(traits.Lister); ok {
		items := []any{}
		for it := lister.Iterator(); it.HasNext() == types.True; {
			item, err := tag(it.Next())
			if err != nil {
				return nil, err
			}
			items = append(items, item)
		}
		return items, nil
	}
	if mapper, ok := value.(traits.Mapper); ok {
		pairs := []any{}
		for it := mapper.Iterator(); it.HasNext() == types.True; {
			key := it.Next()
			k, err := tag(key)
			if err != nil {
				return nil, err
			}
			v, err := tag(mapper.Get(key))
			if err != nil {
				return nil, err
			}
			pairs = append(pairs, []any{k, v})
		}
		return map[string]any{"map": pairs}, nil
	}
	opaque := map[string]any{"opaque": value.Type().TypeName()}
	if s, ok := value.ConvertToType(types.StringType).(types.String); ok {
		opaque["string"] = string(s)
	}
	return opaque, nil
}
