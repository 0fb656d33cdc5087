(** * The rules checker.

    A Gallina semantics of the expression AST of docs/semantics.md (over Z, exact), and a
    function that recomputes the validity flags, the one-step repair table and the raw event
    tables from the rules, column-wise over all states, and compares them with given tables.
    [check_rules_sound]: if it answers [None], the given tables are exactly those the rules
    define, and no assignment the tables use leaves its variable's domain. *)

From Coq Require Import List Arith Bool Lia ZArith.
From Govern Require Import Vec ZVec TableCheck.
Import ListNotations.

Inductive expr : Type :=
| EVar (i : nat) | ELit (z : Z)
| EAdd (a b : expr) | ESub (a b : expr) | EMin (a b : expr) | EMax (a b : expr)
| EIte (c a b : expr)
| EEq (a b : expr) | ELt (a b : expr) | ELe (a b : expr)
| EAnd (p q : expr) | EOr (p q : expr) | ENot (p : expr).

(** The meaning of an expression at a state [x] (x i = value of variable i). *)
Fixpoint eval (x : nat -> Z) (e : expr) : Z :=
  match e with
  | EVar i => x i
  | ELit z => z
  | EAdd a b => (eval x a + eval x b)%Z
  | ESub a b => (eval x a - eval x b)%Z
  | EMin a b => Z.min (eval x a) (eval x b)
  | EMax a b => Z.max (eval x a) (eval x b)
  | EIte c a b => if nz (eval x c) then eval x a else eval x b
  | EEq a b => b2z (Z.eqb (eval x a) (eval x b))
  | ELt a b => b2z (Z.ltb (eval x a) (eval x b))
  | ELe a b => b2z (Z.leb (eval x a) (eval x b))
  | EAnd p q => b2z (nz (eval x p) && nz (eval x q))
  | EOr p q => b2z (nz (eval x p) || nz (eval x q))
  | ENot p => b2z (negb (nz (eval x p)))
  end.

(** The same, on every state at once: [cols] holds one column per variable. *)
Fixpoint veval (n : nat) (cols : list zvec) (e : expr) : zvec :=
  match e with
  | EVar i => nth i cols (zconst n 0)
  | ELit z => zconst n z
  | EAdd a b => zadd (veval n cols a) (veval n cols b)
  | ESub a b => zsub (veval n cols a) (veval n cols b)
  | EMin a b => zmin (veval n cols a) (veval n cols b)
  | EMax a b => zmax (veval n cols a) (veval n cols b)
  | EIte c a b => zite (veval n cols c) (veval n cols a) (veval n cols b)
  | EEq a b => zeq (veval n cols a) (veval n cols b)
  | ELt a b => zlt (veval n cols a) (veval n cols b)
  | ELe a b => zle (veval n cols a) (veval n cols b)
  | EAnd p q => zand (veval n cols p) (veval n cols q)
  | EOr p q => zor (veval n cols p) (veval n cols q)
  | ENot p => znot (veval n cols p)
  end.

Definition assignment : Type := list (nat * expr).

(** Variables are (lowest value, size); the layout adds each variable's stride. *)
Fixpoint layout (vars : list (Z * nat)) (stride : nat) : list (Z * nat * nat) :=
  match vars with
  | [] => []
  | (lo, size) :: t => (lo, size, stride) :: layout t (stride * size)
  end.

Fixpoint nstates_aux (vars : list (Z * nat)) (acc : nat) : nat :=
  match vars with [] => acc | (_, size) :: t => nstates_aux t (acc * size) end.
Definition nstates (vars : list (Z * nat)) : nat := nstates_aux vars 1.

(** The value of variable i at state s: lo_i + (s / stride_i) mod size_i. *)
Definition decode (vars : list (Z * nat)) (s : nat) (i : nat) : Z :=
  match nth_error (layout vars 1) i with
  | Some (lo, size, stride) => (lo + Z.of_nat ((s / stride) mod size))%Z
  | None => 0%Z
  end.

(** An assignment at state x (whose id is acc): the new state's id, s + the sum over assigned
    variables of (new value - old value) * stride, which is the sum of (x'_i - lo_i) * stride_i of
    docs/semantics.md; and whether every assigned value lies in its variable's domain. *)
Fixpoint enc_spec (x : nat -> Z) (lay : list (Z * nat * nat)) (asg : assignment) (acc : Z) (ok : bool) : Z * bool :=
  match asg with
  | [] => (acc, ok)
  | (i, e) :: t =>
      match nth_error lay i with
      | Some (lo, size, stride) =>
          let v := eval x e in
          enc_spec x lay t (acc + (v - x i) * Z.of_nat stride)%Z
                   (ok && Z.leb lo v && Z.ltb v (lo + Z.of_nat size)%Z)
      | None => enc_spec x lay t acc false
      end
  end.

Definition assign_spec (vars : list (Z * nat)) (x : nat -> Z) (asg : assignment) (s : nat) : nat * bool :=
  let r := enc_spec x (layout vars 1) asg (Z.of_nat s) true in (Z.to_nat (fst r), snd r).

Definition valid_spec (vars : list (Z * nat)) (invs : list (expr * assignment)) (s : nat) : bool :=
  forallb (fun inv => nz (eval (decode vars s) (fst inv))) invs.

(** One repair step: the assignment of the first violated invariant (s itself when valid);
    the flag says that assignment stays in the domains. *)
Fixpoint repair_spec (vars : list (Z * nat)) (invs : list (expr * assignment)) (s : nat) : nat * bool :=
  match invs with
  | [] => (s, true)
  | (h, asg) :: t => if nz (eval (decode vars s) h) then repair_spec vars t s
                     else assign_spec vars (decode vars s) asg s
  end.

Definition apply_spec (vars : list (Z * nat)) (ev : expr * assignment) (s : nat) : nat * bool :=
  if nz (eval (decode vars s) (fst ev)) then assign_spec vars (decode vars s) (snd ev) s else (s, true).

(** ** The checker *)

Definition all_false (n : nat) : mask := mmark n (viota 0).
Definition all_true (n : nat) : mask := znz (zconst n 1).

Fixpoint enc_loop (n : nat) (cols : list zvec) (lay : list (Z * nat * nat)) (asg : assignment)
    (acc : zvec) (ok : mask) : zvec * mask :=
  match asg with
  | [] => (acc, ok)
  | (i, e) :: t =>
      match nth_error lay i with
      | Some (lo, size, stride) =>
          let v := veval n cols e in
          enc_loop n cols lay t (zaxpy acc v (nth i cols (zconst n 0)) (Z.of_nat stride))
                   (zinand ok v lo (lo + Z.of_nat size)%Z)
      | None => enc_loop n cols lay t acc (all_false n)
      end
  end.

(** Starts from the state ids themselves, [ids] = the column 0, 1, ..., n-1 (computed once). *)
Definition encode (n : nat) (cols : list zvec) (lay : list (Z * nat * nat)) (ids : zvec) (asg : assignment) : zvec * mask :=
  enc_loop n cols lay asg ids (all_true n).

Fixpoint rep_loop (n : nat) (cols : list zvec) (lay : list (Z * nat * nat)) (ids : zvec) (invs : list (expr * assignment))
    (done : mask) (acc : vec) (ok : bool) : mask * vec * bool :=
  match invs with
  | [] => (done, acc, ok)
  | (h, asg) :: t =>
      let viol := znz (znot (veval n cols h)) in
      let applied := mandn viol done in
      let r := encode n cols lay ids asg in
      rep_loop n cols lay ids t (mor done viol) (vselect applied (ztonat (fst r)) acc)
               (ok && mnone applied (snd r))
  end.

(** [None]: every event table is what the rules define; otherwise the first bad event's code. *)
Fixpoint ev_loop (n : nat) (cols : list zvec) (lay : list (Z * nat * nat)) (ids : zvec) (evs : list (expr * assignment))
    (apply : list vec) (k : nat) : option nat :=
  match evs, apply with
  | [], [] => None
  | (g, asg) :: t, row :: rt =>
      let gm := znz (veval n cols g) in
      let r := encode n cols lay ids asg in
      if Nat.eqb (vlen row) n && vseleq gm (ztonat (fst r)) (viota n) row
      then if mnone gm (snd r) then ev_loop n cols lay ids t rt (S k) else Some (S (S (k + k)))
      else Some (S (k + k))
  | _, _ => Some 0
  end.

(** Result codes: None = the tables are exactly those of the rules; Some 0 = sizes or shapes;
    1 = validity; 2 = repair table; 3 = a repair leaves a variable's domain or the number of event
    tables; 4 + 2k = event k's table; 5 + 2k = event k leaves a variable's domain. *)
Definition check_rules (vars : list (Z * nat)) (invs : list (expr * assignment)) (evs : list (expr * assignment))
    (valid : mask) (repair : vec) (apply : list vec) : option nat :=
  let n := nstates vars in
  let lay := layout vars 1 in
  let cols := tmap (fun l => match l with (lo, size, stride) => zcol n stride size lo end) lay in
  if negb (Nat.eqb (mlen valid) n && Nat.eqb (vlen repair) n) then Some 0 else
  let ids := zcol n 1 n 0 in
  match rep_loop n cols lay ids invs (all_false n) (viota n) true with
  | (done, acc, ok) =>
    if negb (Nat.eqb (mcount (mand valid done)) 0 && Nat.eqb (mcount (mor valid done)) n) then Some 1 else
    if negb (mall (veq acc repair)) then Some 2 else
    if negb ok then Some 3 else
    match ev_loop n cols lay ids evs apply 0 with None => None | Some c => Some (S (S (S c))) end
  end.

(** ** Soundness *)

Lemma mcount_full m : mcount m = mlen m -> forall i, i < mlen m -> mnth m i = true.
Proof.
  unfold mcount, mlen, mnth. destruct m as [l]; simpl.
  assert (Hle : forall l : list bool, length (filter (fun b : bool => b) l) <= length l).
  { induction l0 as [|b t IH]; simpl; [lia|destruct b; simpl; lia]. }
  induction l as [|b l IH]; simpl; intros H i Hi; [lia|].
  destruct b; simpl in H.
  - destruct i; auto. apply IH; [lia|lia].
  - specialize (Hle l). lia.
Qed.

Section Cols.
Variable n : nat.
Variable cols : list zvec.
Hypothesis Hcols : forall i, zlen (nth i cols (zconst n 0)) = n.

Definition xs (s : nat) (i : nat) : Z := znth (nth i cols (zconst n 0)) s.

Lemma veval_spec e : zlen (veval n cols e) = n /\ forall s, s < n -> znth (veval n cols e) s = eval (xs s) e.
Proof.
  induction e; simpl; repeat match goal with H : _ /\ _ |- _ => destruct H end.
  all: try (split; [apply Hcols|intros; reflexivity]).
  all: try (split; [apply zlen_zconst|intros s Hs; apply znth_zconst; auto]).
  all: try (unfold zadd, zsub, zmin, zmax, zeq, zlt, zle, zand, zor;
            split; [rewrite zlen_zmap2; congruence|];
            intros s Hs; rewrite znth_zmap2 by congruence; cbv beta;
            repeat match goal with Hx : forall s, s < n -> znth (veval n cols ?e) s = _ |- _ =>
                     rewrite Hx by auto end; reflexivity).
  all: try (split; [rewrite zlen_zite; congruence|]; intros s Hs;
            rewrite znth_zite by congruence;
            repeat match goal with Hx : forall s, s < n -> znth (veval n cols ?e) s = _ |- _ =>
                     rewrite Hx by auto end; reflexivity).
  all: try (unfold znot; split; [unfold zlen; simpl; rewrite zlen_map1; auto|];
            intros s Hs; unfold znth at 1; simpl; rewrite znth_map1 by congruence;
            repeat match goal with Hx : forall s, s < n -> znth (veval n cols ?e) s = _ |- _ =>
                     rewrite Hx by auto end; reflexivity).
Qed.

Lemma all_false_spec s : s < n -> mnth (all_false n) s = false.
Proof.
  intros Hs. destruct (mnth (all_false n) s) eqn:E; auto. apply mnth_mmark in E; auto.
  destruct E as [j [Hj _]]. rewrite vlen_viota in Hj. lia.
Qed.

Lemma enc_loop_spec lay asg : forall acc ok, zlen acc = n -> mlen ok = n ->
  zlen (fst (enc_loop n cols lay asg acc ok)) = n /\ mlen (snd (enc_loop n cols lay asg acc ok)) = n /\
  forall s, s < n ->
    (znth (fst (enc_loop n cols lay asg acc ok)) s, mnth (snd (enc_loop n cols lay asg acc ok)) s)
    = enc_spec (xs s) lay asg (znth acc s) (mnth ok s).
Proof.
  induction asg as [|[i e] t IH]; intros acc ok Ha Ho; simpl; [auto|].
  destruct (nth_error lay i) as [[[lo size] stride]|].
  - unfold zaxpy, zinand. destruct (veval_spec e) as [Hl Hv].
    assert (Hsub : zlen (zsub (veval n cols e) (nth i cols (zconst n 0))) = n).
    { unfold zsub. rewrite zlen_zmap2; rewrite ?Hcols; auto. }
    assert (Hmul : zlen (zmulc (zsub (veval n cols e) (nth i cols (zconst n 0))) (Z.of_nat stride)) = n).
    { rewrite zlen_zmulc. exact Hsub. }
    edestruct IH as (H1 & H2 & H3).
    3: split; [exact H1|split; [exact H2|]].
    + unfold zadd. rewrite zlen_zmap2; congruence.
    + rewrite mlen_mand; auto. rewrite mlen_zinrange. congruence.
    + intros s Hs. rewrite H3 by auto. f_equal.
      * unfold zadd. rewrite znth_zmap2 by congruence. f_equal.
        rewrite znth_zmulc by congruence.
        unfold zsub. rewrite znth_zmap2 by (rewrite ?Hcols; congruence).
        rewrite Hv by auto. reflexivity.
      * rewrite mnth_mand by (rewrite ?mlen_zinrange; congruence).
        rewrite mnth_zinrange by congruence. rewrite Hv by auto. apply andb_assoc.
  - edestruct IH as (H1 & H2 & H3).
    3: split; [exact H1|split; [exact H2|]].
    + exact Ha.
    + apply mlen_mmark.
    + intros s Hs. rewrite H3 by auto. rewrite all_false_spec by auto. reflexivity.
Qed.

Definition ids := zcol n 1 n 0.

Lemma encode_spec lay asg :
  zlen (fst (encode n cols lay ids asg)) = n /\ mlen (snd (encode n cols lay ids asg)) = n /\
  forall s, s < n ->
    (znth (fst (encode n cols lay ids asg)) s, mnth (snd (encode n cols lay ids asg)) s)
    = enc_spec (xs s) lay asg (Z.of_nat s) true.
Proof.
  unfold encode.
  assert (Hm : mlen (all_true n) = n) by (unfold all_true; rewrite mlen_znz, zlen_zconst; auto).
  destruct (enc_loop_spec lay asg ids (all_true n) (zlen_zcol n 1 n 0) Hm) as (H1 & H2 & H3).
  split; [auto|split; [auto|]]. intros s Hs. rewrite H3 by auto. f_equal.
  - unfold ids. rewrite znth_zcol by auto. rewrite Nat.div_1_r, Nat.mod_small by auto. reflexivity.
  - unfold all_true. rewrite mnth_znz by (rewrite zlen_zconst; auto). rewrite znth_zconst by auto. reflexivity.
Qed.

(** The scalar meaning of the repair loop at one state. *)
Fixpoint rep_sc (x : nat -> Z) (lay : list (Z * nat * nat)) (invs : list (expr * assignment)) (s : nat)
    (done : bool) (acc : nat) (ok : bool) : bool * nat * bool :=
  match invs with
  | [] => (done, acc, ok)
  | (h, asg) :: t =>
      let viol := negb (nz (eval x h)) in
      let applied := viol && negb done in
      let r := enc_spec x lay asg (Z.of_nat s) true in
      rep_sc x lay t s (done || viol) (if applied then Z.to_nat (fst r) else acc) (ok && negb (applied && negb (snd r)))
  end.

Lemma rep_sc_ok x lay invs s done acc ok :
  rep_sc x lay invs s done acc ok =
  (fst (fst (rep_sc x lay invs s done acc true)), snd (fst (rep_sc x lay invs s done acc true)),
   ok && snd (rep_sc x lay invs s done acc true)).
Proof.
  revert done acc ok. induction invs as [|[h asg] t IH]; intros done acc ok; simpl.
  - rewrite andb_true_r. reflexivity.
  - rewrite IH. rewrite (IH _ _ (negb _)). simpl. rewrite andb_assoc. reflexivity.
Qed.

Lemma rep_loop_spec lay invs : forall done acc ok, mlen done = n -> vlen acc = n ->
  let r := rep_loop n cols lay ids invs done acc ok in
  mlen (fst (fst r)) = n /\ vlen (snd (fst r)) = n /\
  (forall s, s < n -> (mnth (fst (fst r)) s, vnth (snd (fst r)) s)
                      = fst (rep_sc (xs s) lay invs s (mnth done s) (vnth acc s) true)) /\
  (snd r = true -> ok = true /\ forall s, s < n -> snd (rep_sc (xs s) lay invs s (mnth done s) (vnth acc s) true) = true).
Proof.
  induction invs as [|[h asg] t IH]; intros done acc ok Hd Ha; simpl.
  - split; [auto|split; [auto|split; [auto|]]]. intros ->; auto.
  - destruct (veval_spec h) as [Hhl Hhv].
    destruct (encode_spec lay asg) as (He1 & He2 & He3).
    set (viol := znz (znot (veval n cols h))).
    assert (Hvl : mlen viol = n) by (unfold viol; rewrite mlen_znz, zlen_znot; auto).
    assert (Hvv : forall s, s < n -> mnth viol s = negb (nz (eval (xs s) h))).
    { intros s Hs. unfold viol. rewrite mnth_znz by (rewrite zlen_znot; congruence).
      rewrite znth_znot by congruence. rewrite Hhv by auto. unfold b2z, nz.
      destruct (Z.eqb (eval (xs s) h) 0); reflexivity. }
    set (applied := mandn viol done).
    assert (Hal : mlen applied = n) by (unfold applied; rewrite mlen_mandn; congruence).
    assert (Hav : forall s, s < n -> mnth applied s = negb (nz (eval (xs s) h)) && negb (mnth done s)).
    { intros s Hs. unfold applied. rewrite mnth_mandn, Hvv by congruence. reflexivity. }
    set (r := encode n cols lay ids asg) in *.
    edestruct (IH (mor done viol) (vselect applied (ztonat (fst r)) acc)
                  (ok && mnone applied (snd r))) as (I1 & I2 & I3 & I4).
    + rewrite mlen_mor; congruence.
    + rewrite vlen_vselect; rewrite ?vlen_ztonat; congruence.
    + split; [exact I1|split; [exact I2|split]].
      * intros s Hs. rewrite I3 by auto.
        rewrite mnth_mor, Hvv by congruence.
        rewrite vnth_vselect by (rewrite ?vlen_ztonat; congruence).
        rewrite Hav, vnth_ztonat by congruence.
        specialize (He3 s Hs). rewrite <- He3. simpl.
        rewrite (rep_sc_ok (xs s) lay t s _ _ (negb _)). simpl.
        destruct (rep_sc (xs s) lay t s _ _ true) as [[? ?] ?]; reflexivity.
      * intros Hok. destruct (I4 Hok) as [Hok' Hall].
        apply andb_prop in Hok' as [Hok1 Hc]. unfold mnone in Hc. apply Nat.eqb_eq in Hc.
        split; [exact Hok1|]. intros s Hs.
        assert (Hb := mcount_zero _ Hc s). rewrite mlen_mandn in Hb by congruence.
        specialize (Hb ltac:(congruence)). rewrite mnth_mandn in Hb by congruence.
        specialize (Hall s Hs). rewrite mnth_mor, Hvv in Hall by congruence.
        rewrite vnth_vselect in Hall by (rewrite ?vlen_ztonat; congruence).
        rewrite Hav, vnth_ztonat in Hall by congruence.
        rewrite Hav in Hb by auto.
        specialize (He3 s Hs). rewrite <- He3. simpl.
        rewrite (rep_sc_ok (xs s) lay t s _ _ (negb _)). simpl. rewrite Hall.
        destruct (negb (nz (eval (xs s) h)) && negb (mnth done s)); simpl in *; auto.
        rewrite Hb. reflexivity.
Qed.

Lemma ev_loop_spec lay evs : forall apply k, ev_loop n cols lay ids evs apply k = None ->
  length apply = length evs /\
  forall e s, e < length evs -> s < n ->
    let ev := nth e evs (ELit 0, []) in
    let r := enc_spec (xs s) lay (snd ev) (Z.of_nat s) true in
    vnth (nth e apply dflt) s = (if nz (eval (xs s) (fst ev)) then Z.to_nat (fst r) else s)
    /\ (nz (eval (xs s) (fst ev)) = true -> snd r = true).
Proof.
  induction evs as [|[g asg] t IH]; intros apply k H; destruct apply as [|row rt]; simpl in H; try discriminate.
  - split; [auto|intros e s He; simpl in He; lia].
  - destruct (veval_spec g) as [Hgl Hgv].
    destruct (encode_spec lay asg) as (He1 & He2 & He3).
    set (gm := znz (veval n cols g)) in *.
    set (r := encode n cols lay ids asg) in *.
    destruct (Nat.eqb (vlen row) n && vseleq gm (ztonat (fst r)) (viota n) row) eqn:Hrow;
      [|discriminate].
    destruct (mnone gm (snd r)) eqn:Hdom; [|discriminate].
    apply andb_prop in Hrow as [Hrl Hrv]. unfold vseleq in Hrv. unfold mnone in Hdom.
    apply Nat.eqb_eq in Hrl. apply Nat.eqb_eq in Hdom.
    destruct (IH rt (S k) H) as [IHl IHv].
    split; [simpl; congruence|].
    intros [|e] s He Hs; simpl; [|apply IHv; simpl in He; lia].
    assert (Hgm : mlen gm = n) by (unfold gm; rewrite mlen_znz; auto).
    assert (Hsel : vlen (vselect gm (ztonat (fst r)) (viota n)) = n).
    { rewrite vlen_vselect; rewrite ?vlen_ztonat, ?vlen_viota; congruence. }
    rewrite mall_spec in Hrv. rewrite mlen_veq in Hrv by congruence. rewrite Hsel in Hrv.
    specialize (Hrv s Hs). rewrite mnth_veq in Hrv by congruence. apply Nat.eqb_eq in Hrv.
    rewrite vnth_vselect in Hrv by (rewrite ?vlen_ztonat, ?vlen_viota; congruence).
    assert (Hg : mnth gm s = nz (eval (xs s) g)).
    { unfold gm. rewrite mnth_znz by congruence. rewrite Hgv by auto. reflexivity. }
    rewrite Hg, vnth_ztonat, vnth_viota in Hrv by congruence.
    specialize (He3 s Hs). rewrite <- He3. simpl. split; [congruence|].
    intros Hnz. assert (Hb := mcount_zero _ Hdom s). rewrite mlen_mandn in Hb by congruence.
    specialize (Hb ltac:(congruence)). rewrite mnth_mandn, Hg, Hnz in Hb by congruence.
    destruct (mnth (snd r) s); [reflexivity|discriminate].
Qed.

End Cols.

(** ** Columns are the decoding of state ids *)

Definition cols_of (vars : list (Z * nat)) : list zvec :=
  let n := nstates vars in
  tmap (fun l => match l with (lo, size, stride) => zcol n stride size lo end) (layout vars 1).

Lemma cols_len vars i : zlen (nth i (cols_of vars) (zconst (nstates vars) 0)) = nstates vars.
Proof.
  unfold cols_of. rewrite tmap_map.
  destruct (Nat.lt_ge_cases i (length (layout vars 1))) as [H|H].
  - rewrite nth_map_lt with (d' := (0%Z, 0, 0)) by auto. destruct (nth i (layout vars 1) _) as [[lo size] st].
    apply zlen_zcol.
  - rewrite nth_overflow by (rewrite map_length; auto). apply zlen_zconst.
Qed.

Lemma cols_decode vars s i : s < nstates vars ->
  xs (nstates vars) (cols_of vars) s i = decode vars s i.
Proof.
  intros Hs. unfold xs, decode, cols_of. rewrite tmap_map.
  destruct (Nat.lt_ge_cases i (length (layout vars 1))) as [H|H].
  - rewrite nth_map_lt with (d' := (0%Z, 0, 0)) by auto.
    rewrite (nth_error_nth' _ (0%Z, 0, 0) H).
    destruct (nth i (layout vars 1) _) as [[lo size] st]. apply znth_zcol; auto.
  - rewrite nth_overflow by (rewrite map_length; auto).
    rewrite (proj2 (nth_error_None _ _) H). apply znth_zconst; auto.
Qed.

Lemma xs_decode_ext vars s : s < nstates vars -> forall e, eval (xs (nstates vars) (cols_of vars) s) e = eval (decode vars s) e.
Proof.
  intros Hs e. induction e; simpl; try rewrite IHe1, IHe2; try rewrite IHe3; try rewrite IHe; auto.
  apply cols_decode; auto.
Qed.

Lemma enc_spec_ext x y lay asg acc ok : (forall j, x j = y j) ->
  enc_spec x lay asg acc ok = enc_spec y lay asg acc ok.
Proof.
  intros Hxy.
  assert (He : forall e, eval x e = eval y e).
  { induction e; simpl; try rewrite IHe1, IHe2; try rewrite IHe3; try rewrite IHe; auto. }
  revert acc ok. induction asg as [|[i e] t IH]; intros acc ok; simpl; auto.
  destruct (nth_error lay i) as [[[lo size] st]|]; rewrite ?He, ?Hxy; apply IH.
Qed.

Lemma rep_sc_spec vars invs s : forall x, (forall j, x j = decode vars s j) ->
  rep_sc x (layout vars 1) invs s false s true
  = (negb (valid_spec vars invs s), fst (repair_spec vars invs s), snd (repair_spec vars invs s)).
Proof.
  intros x Hx.
  assert (He : forall e, eval x e = eval (decode vars s) e).
  { induction e; simpl; try rewrite IHe1, IHe2; try rewrite IHe3; try rewrite IHe; auto. }
  assert (Hdone : forall invs acc ok, rep_sc x (layout vars 1) invs s true acc ok = (true, acc, ok)).
  { induction invs0 as [|[h asg] t IH]; intros acc ok; simpl; auto.
    destruct (negb (nz (eval x h))); simpl; rewrite ?andb_true_r; apply IH. }
  unfold valid_spec. induction invs as [|[h asg] t IH]; simpl; auto.
  rewrite He. destruct (nz (eval (decode vars s) h)); simpl.
  - exact IH.
  - rewrite Hdone. unfold assign_spec. rewrite (enc_spec_ext x (decode vars s)) by auto.
    destruct (snd (enc_spec (decode vars s) (layout vars 1) asg (Z.of_nat s) true)); reflexivity.
Qed.

(** ** The headline theorem of the rules checker *)

(** If the rules checker answers [None], then with [n] the number of states the variables define:
    the tables have that size, one event table per event, and at every state [s]
    - the validity flag is the conjunction of the invariants,
    - the repair entry is the first violated invariant's repair (s itself when valid), and that
      repair stays inside every variable's domain,
    - each event's entry is its effect when its guard holds (else s), and that effect stays
      inside every variable's domain. *)
Theorem check_rules_sound vars invs evs valid repair apply :
  check_rules vars invs evs valid repair apply = None ->
  let n := nstates vars in
  mlen valid = n /\ vlen repair = n /\ length apply = length evs /\
  forall s, s < n ->
    mnth valid s = valid_spec vars invs s
    /\ vnth repair s = fst (repair_spec vars invs s) /\ snd (repair_spec vars invs s) = true
    /\ forall e, e < length evs ->
         vnth (nth e apply dflt) s = fst (apply_spec vars (nth e evs (ELit 0, [])) s)
         /\ snd (apply_spec vars (nth e evs (ELit 0, [])) s) = true.
Proof.
  unfold check_rules. fold (cols_of vars). set (n := nstates vars). set (cols := cols_of vars).
  set (lay := layout vars 1).
  destruct (Nat.eqb (mlen valid) n && Nat.eqb (vlen repair) n) eqn:Hsz; simpl; [|discriminate].
  apply andb_prop in Hsz as [Hvl Hrl]. apply Nat.eqb_eq in Hvl. apply Nat.eqb_eq in Hrl.
  assert (Hc : forall i, zlen (nth i cols (zconst n 0)) = n) by apply cols_len.
  assert (Hf : mlen (all_false n) = n) by apply mlen_mmark.
  destruct (rep_loop_spec n cols Hc lay invs (all_false n) (viota n) true Hf (vlen_viota n)) as (R1 & R2 & R3 & R4).
  fold (ids n) in R1, R2, R3, R4. cbv zeta. change (zcol n 1 n 0) with (ids n).
  destruct (rep_loop n cols lay (ids n) invs (all_false n) (viota n) true) as [[done acc] ok] eqn:HR. simpl in *.
  destruct (Nat.eqb (mcount (mand valid done)) 0 && Nat.eqb (mcount (mor valid done)) n) eqn:Hv; simpl;
    [|discriminate].
  apply andb_prop in Hv as [Hv1 Hv2]. apply Nat.eqb_eq in Hv1. apply Nat.eqb_eq in Hv2.
  destruct (mall (veq acc repair)) eqn:Hacc; simpl; [|discriminate].
  destruct ok eqn:Hok; simpl; [|discriminate].
  destruct (ev_loop n cols lay (ids n) evs apply 0) eqn:Hev; [discriminate|]. intros _.
  destruct (ev_loop_spec n cols Hc lay evs apply 0 Hev) as [Hel Hevs].
  split; [auto|split; [auto|split; [auto|]]].
  intros s Hs.
  assert (Hxs : forall j, xs n cols s j = decode vars s j) by (intros; apply cols_decode; auto).
  assert (Hfalse : mnth (all_false n) s = false).
  { destruct (mnth (all_false n) s) eqn:E; auto. apply mnth_mmark in E; auto.
    destruct E as [j [Hj _]]. rewrite vlen_viota in Hj. lia. }
  specialize (R3 s Hs). rewrite Hfalse, vnth_viota in R3 by auto.
  unfold lay in R3. rewrite (rep_sc_spec vars invs s (xs n cols s) Hxs) in R3.
  destruct (R4 eq_refl) as [_ R4']. specialize (R4' s Hs). rewrite Hfalse, vnth_viota in R4' by auto.
  unfold lay in R4'. rewrite (rep_sc_spec vars invs s (xs n cols s) Hxs) in R4'. simpl in R3, R4'. injection R3 as Rd Ra.
  split; [|split; [|split]].
  - assert (A := mcount_zero _ Hv1 s). rewrite mlen_mand in A by congruence. specialize (A ltac:(congruence)).
    rewrite mnth_mand in A by congruence.
    assert (B := mcount_full (mor valid done)). rewrite mlen_mor, Hvl in B by congruence.
    specialize (B Hv2 s Hs). rewrite mnth_mor in B by congruence.
    rewrite Rd in A, B. destruct (mnth valid s), (valid_spec vars invs s); simpl in *; congruence.
  - rewrite mall_spec, mlen_veq in Hacc by congruence. specialize (Hacc s ltac:(congruence)).
    rewrite mnth_veq in Hacc by congruence. apply Nat.eqb_eq in Hacc. congruence.
  - exact R4'.
  - intros e He. destruct (Hevs e s He Hs) as [A B]. unfold apply_spec, assign_spec.
    rewrite <- (xs_decode_ext vars s Hs). fold n cols.
    rewrite <- (enc_spec_ext (xs n cols s) (decode vars s)) by auto.
    destruct (nz (eval (xs n cols s) (fst (nth e evs (ELit 0, []))))); simpl; auto.
Qed.
